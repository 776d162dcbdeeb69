/* fly-cpp native hot path: per-row reductions and sampling over llama.cpp logits rows.
 * See flyrows.h for the contract.
 *
 * Five loops touch every logit of a row (max, argmax, "any above t", the sum of exp and a rough one); everything else works on a handful of values. Those five are written once in
 * flyrows_kernels.h with GCC/Clang vector extensions and compiled for the baseline and, on
 * x86-64, for AVX2+FMA and AVX-512; the widest one the CPU has is picked at the first call, so
 * the default build stays portable (no -march=native). Other compilers get plain loops. No
 * -ffast-math anywhere: results must match the numpy reference. */
#include "flyrows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 256 /* floats per block when skipping blocks that cannot change a top-k list */

int fly_abi_version(void) { return FLY_ABI_VERSION; }

/* ---- row kernels ------------------------------------------------------------------------- */

struct kernels {
    float (*row_max)(const float *x, int64_t n);
    int64_t (*argmax)(const float *x, int64_t n);
    int (*any_above)(const float *x, int64_t n, float t);
    double (*exp_sum)(const float *x, int64_t n, float peak);
    double (*exp_sum_rough)(const float *x, int64_t n, float peak); /* within about 1e-4 of exp_sum */
    const char *name;
};

/* expf for x <= 0 (Cephes' polynomial, about 1 ulp): e^x = 2^k * e^r with |r| <= ln2/2.
 * Returns 0 below -87.3 (e^x is then under FLT_MIN) and for -inf. */
#define EXP_LO (-87.3f)
#define EXP_POLY(p, r)                            \
    p = 1.9875691500e-4f * r + 1.3981999507e-3f; \
    p = p * r + 8.3334519073e-3f;                \
    p = p * r + 4.1665795894e-2f;                \
    p = p * r + 1.6666665459e-1f;                \
    p = p * r + 5.0000001201e-1f;

static inline float exp_nonpos(float x) {
    if (!(x >= EXP_LO)) return 0.0f;
    float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float p;
    EXP_POLY(p, r)
    float y = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23; /* k in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

static float row_max_scalar(const float *x, int64_t n) {
    float best = x[0];
    for (int64_t i = 1; i < n; i++) best = x[i] > best ? x[i] : best;
    return best;
}

static int any_above_scalar(const float *x, int64_t n, float t) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] > t) return 1;
    return 0;
}

static int64_t argmax_scalar(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static double exp_sum_scalar(const float *x, int64_t n, float peak) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)exp_nonpos(x[i] - peak);
    return s;
}

static const struct kernels kernels_scalar = {.row_max = row_max_scalar, .argmax = argmax_scalar,
                                              .any_above = any_above_scalar, .exp_sum = exp_sum_scalar,
                                              .exp_sum_rough = exp_sum_scalar,
                                              .name = "scalar"};

#if (defined(__GNUC__) || defined(__clang__)) && !defined(FLY_SCALAR_ONLY)
#define FLY_VECTOR 1
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* wide vectors only pass between functions of one target */
#endif

#define KW 4
#define K(name) name##_w4
#define KNAME "baseline"
#include "flyrows_kernels.h"
#undef KW
#undef K
#undef KNAME

#if defined(__x86_64__) || defined(__i386__)
#define FLY_X86 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define KW 8
#define K(name) name##_avx2
#define KNAME "avx2"
#include "flyrows_kernels.h"
#undef KW
#undef K
#undef KNAME
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif
#define KW 16
#define K(name) name##_avx512
#define KNAME "avx512"
#include "flyrows_kernels.h"
#undef KW
#undef K
#undef KNAME
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* x86 */
#endif /* vector extensions */

/* The widest kernels this CPU runs; FLY_CPP_NATIVE_ISA (scalar, baseline, avx2, avx512) picks
 * a narrower set, so that tests can check every compiled variant on one machine. */
static const struct kernels *pick_kernels(void) {
    const char *want = getenv("FLY_CPP_NATIVE_ISA");
    int any = !want || !*want;
    if (!any && strcmp(want, "scalar") == 0) return &kernels_scalar;
#ifdef FLY_VECTOR
#ifdef FLY_X86
    __builtin_cpu_init();
    if ((any || strcmp(want, "avx512") == 0) && __builtin_cpu_supports("avx512f")) return &kernels_avx512;
    if ((any || strcmp(want, "avx512") == 0 || strcmp(want, "avx2") == 0) && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return &kernels_avx2;
#endif
    return &kernels_w4;
#else
    return &kernels_scalar;
#endif
}

static const struct kernels *kern;

static inline const struct kernels *kset(void) { /* a race here only writes the same pointer twice */
    if (!kern) kern = pick_kernels();
    return kern;
}

const char *fly_kernels(void) { return kset()->name; }

/* ---- argmax ------------------------------------------------------------------------------ */

void fly_argmax(const float *x, int64_t rows, int64_t n, int64_t stride, int64_t *out) {
    const struct kernels *k = kset();
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * stride;
        out[r] = n > 0 ? k->argmax(row, n) : 0;
    }
}

/* ---- top entropy ------------------------------------------------------------------------- */

/* Insert v into top[0..*have) (descending), keeping at most `top` values. */
static inline void top_insert(float *best, int *have, int top, float v) {
    int pos = *have < top ? *have : top - 1;
    if (*have == top && !(v > best[top - 1])) return;
    while (pos > 0 && v > best[pos - 1]) {
        best[pos] = best[pos - 1];
        pos--;
    }
    best[pos] = v;
    if (*have < top) (*have)++;
}

/* The `top` largest values of a row (with multiplicity), descending; returns how many. Blocks
 * whose maximum cannot enter the list are skipped after one vectorised pass over them. */
static int top_values(const float *x, int64_t n, int top, float *best) {
    int have = 0;
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t len = n - i < BLOCK ? n - i : BLOCK;
        if (have == top && !kset()->any_above(x + i, len, best[top - 1])) continue;
        for (int64_t j = 0; j < len; j++) top_insert(best, &have, top, x[i + j]);
    }
    return have;
}

static double top_entropy_row(const float *x, int64_t n, int top) {
    float best[FLY_MAX_TOP];
    int have = top_values(x, n, top, best);
    float peak = best[0];
    double lse = log(kset()->exp_sum(x, n, peak)) + (double)peak;
    double h = 0.0;
    for (int i = 0; i < have; i++) {
        double l = (double)best[i] - lse;
        if (l > -INFINITY) h -= exp(l) * l;
    }
    return h;
}

int fly_top_entropy(const float *x, int64_t rows, int64_t n, int64_t stride, int32_t top, double *out) {
    if (top < 1 || top > FLY_MAX_TOP || n < 1) return -1;
    for (int64_t r = 0; r < rows; r++) out[r] = top_entropy_row(x + r * stride, n, top);
    return 0;
}

void fly_top_probability(const float *x, int64_t rows, int64_t n, int64_t stride, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * stride;
        out[r] = n > 0 ? 1.0 / kset()->exp_sum_rough(row, n, kset()->row_max(row, n)) : NAN;
    }
}

/* ---- sampling ---------------------------------------------------------------------------- */

typedef struct {
    float v;
    int32_t id;
} cand;

static int cand_order(const void *a, const void *b) { /* logit descending, then id ascending */
    const cand *p = a, *q = b;
    if (p->v != q->v) return p->v > q->v ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}

/* The k largest entries as candidates, ordered; for small k (one pass, a sorted buffer). */
static int64_t top_k_small(const float *x, int64_t n, int64_t k, cand *c) {
    int64_t have = 0;
    for (int64_t i = 0; i < n; i += BLOCK) {
        int64_t len = n - i < BLOCK ? n - i : BLOCK;
        if (have == k && !kset()->any_above(x + i, len, c[k - 1].v)) continue;
        for (int64_t j = i; j < i + len; j++) {
            float v = x[j];
            if (have == k && !(v > c[k - 1].v)) continue;
            int64_t pos = have < k ? have++ : k - 1;
            while (pos > 0 && v > c[pos - 1].v) { /* equal values keep the earlier id first */
                c[pos] = c[pos - 1];
                pos--;
            }
            c[pos].v = v;
            c[pos].id = (int32_t)j;
        }
    }
    return have;
}

static void swap_f(float *a, float *b) {
    float t = *a;
    *a = *b;
    *b = t;
}

/* The k-th largest value (1-based, with multiplicity); three-way quickselect on a copy. */
static int kth_largest(const float *x, int64_t n, int64_t k, float *out) {
    float *a = malloc((size_t)n * sizeof *a);
    if (!a) return -2;
    memcpy(a, x, (size_t)n * sizeof *a);
    int64_t lo = 0, hi = n - 1, want = k - 1; /* index in descending order */
    while (lo < hi) {
        float pivot = a[lo + (hi - lo) / 2];
        int64_t lt = lo, i = lo, gt = hi; /* a[lo..lt) > pivot, a[lt..i) == pivot, a(gt..hi] < pivot */
        while (i <= gt) {
            if (a[i] > pivot) swap_f(&a[lt++], &a[i++]);
            else if (a[i] < pivot) swap_f(&a[i], &a[gt--]);
            else i++;
        }
        if (want < lt) hi = lt - 1;
        else if (want > gt) lo = gt + 1;
        else {
            lo = hi = want;
            a[want] = pivot;
        }
    }
    *out = a[want];
    free(a);
    return 0;
}

#define NBUCKET 256 /* histogram of exp-mass by distance below the peak, 1/4 nat per bucket */

/* Candidates after top-k, with the mass S = sum exp(v - peak) over all of top-k (the
 * normalisation of top-p and min-p). For a large candidate set only the part that top-p or
 * min-p can possibly keep is gathered and sorted. Returns the count, or < 0. */
static int64_t candidates(const float *x, int64_t n, int64_t top_k, double top_p, double min_p, cand **out,
                          double *mass) {
    int64_t k = top_k > 0 && top_k < n ? top_k : n;
    if (k < n && k <= 256) {
        cand *c = malloc((size_t)k * sizeof *c);
        if (!c) return -2;
        int64_t m = top_k_small(x, n, k, c);
        double s = 0.0;
        for (int64_t i = 0; i < m; i++) s += exp((double)c[i].v - (double)c[0].v);
        *out = c;
        *mass = s;
        return m;
    }
    /* membership in top-k: v > tau, or v == tau among the first `ties` such ids */
    float tau = -INFINITY;
    int64_t ties = n;
    if (k < n) {
        if (kth_largest(x, n, k, &tau) < 0) return -2;
        int64_t above = 0;
        for (int64_t i = 0; i < n; i++) above += x[i] > tau;
        ties = k - above;
    }
    float peak = kset()->row_max(x, n);
    double hist[NBUCKET] = {0}, s = 0.0;
    int64_t seen = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (!(v > tau || (v == tau && seen++ < ties))) continue;
        double e = exp((double)v - (double)peak);
        double d = ((double)peak - (double)v) * 4.0;
        hist[d < NBUCKET - 1 ? (int)d : NBUCKET - 1] += e;
        s += e;
    }
    /* lowest logit that top-p / min-p can keep (a superset: the exact tests come later) */
    double floor_v = -INFINITY;
    if (min_p > 0.0) floor_v = (double)peak + log(min_p) - 1e-3;
    if (top_p < 1.0) {
        double cum = 0.0;
        for (int b = 0; b < NBUCKET - 1; b++) {
            cum += hist[b];
            if (cum >= (top_p + 1e-9) * s) { /* everything below this bucket comes after >= top_p mass */
                double f = (double)peak - (b + 1) / 4.0;
                if (f > floor_v) floor_v = f;
                break;
            }
        }
    }
    int64_t m = 0;
    seen = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        int member = v > tau || (v == tau && seen++ < ties);
        m += member && (double)v >= floor_v;
    }
    cand *c = malloc((size_t)(m ? m : 1) * sizeof *c);
    if (!c) return -2;
    m = 0;
    seen = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        int member = v > tau || (v == tau && seen++ < ties);
        if (member && (double)v >= floor_v) {
            c[m].v = v;
            c[m].id = (int32_t)i;
            m++;
        }
    }
    qsort(c, (size_t)m, sizeof *c, cand_order);
    *out = c;
    *mass = s;
    return m;
}

/* The whole chain; on success *kept holds the kept candidates and *probs their tempered,
 * normalised probabilities (both malloc'd), and the count is returned. */
static int64_t chain(const float *row, int64_t n, double temperature, int64_t top_k, double top_p, double min_p,
                     cand **kept, double **probs) {
    if (!row || n < 1 || n > INT32_MAX || !(temperature > 0.0)) return -1;
    cand *c = NULL;
    double s = 0.0;
    int64_t m = candidates(row, n, top_k, top_p, min_p, &c, &s);
    if (m < 0) return m;
    /* top-p then min-p, as in the reference: p over all of top-k, cumulative before each */
    double v0 = (double)c[0].v, p0 = 1.0 / s, cum = 0.0;
    int64_t keep = m;
    for (int64_t i = 0; i < m; i++) {
        double p = exp((double)c[i].v - v0) / s;
        cum += p;
        int ok = 1;
        if (top_p < 1.0) ok &= (cum - p) < top_p;
        if (min_p > 0.0) ok &= p >= min_p * p0;
        if (!ok && i > 0) {
            keep = i;
            break;
        }
    }
    double *q = malloc((size_t)keep * sizeof *q);
    if (!q) {
        free(c);
        return -2;
    }
    double total = 0.0;
    for (int64_t i = 0; i < keep; i++) {
        q[i] = exp(((double)c[i].v - v0) / temperature);
        total += q[i];
    }
    for (int64_t i = 0; i < keep; i++) q[i] /= total;
    *kept = c;
    *probs = q;
    return keep;
}

int64_t fly_draw(const double *probs, int64_t n, double u) {
    if (!probs || n < 1) return -1;
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) total += probs[i];
    double target = u * total, cum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        cum += probs[i];
        if (cum > target) return i;
    }
    return n - 1;
}

int64_t fly_distribution(const float *row, int64_t n, double temperature, int64_t top_k, double top_p,
                         double min_p, int64_t *ids, double *probs, int64_t cap) {
    cand *c;
    double *q;
    int64_t m = chain(row, n, temperature, top_k, top_p, min_p, &c, &q);
    if (m < 0) return m;
    if (m <= cap && ids && probs) {
        for (int64_t i = 0; i < m; i++) {
            ids[i] = c[i].id;
            probs[i] = q[i];
        }
    }
    free(c);
    free(q);
    return m;
}

int64_t fly_sample(const float *row, int64_t n, double temperature, int64_t top_k, double top_p, double min_p,
                   double u) {
    cand *c;
    double *q;
    int64_t m = chain(row, n, temperature, top_k, top_p, min_p, &c, &q);
    if (m < 0) return m;
    int64_t token = c[fly_draw(q, m, u)].id;
    free(c);
    free(q);
    return token;
}

/* splitmix64's constants and finaliser (fly_cpp.backend.sampling._mix) */
#define MIX1 0xBF58476D1CE4E5B9ULL
#define MIX2 0x94D049BB133111EBULL
#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * MIX1;
    x = (x ^ (x >> 27)) * MIX2;
    return x ^ (x >> 31);
}

int64_t fly_shared_draw(const float *row, int64_t n, double temperature, int64_t top_k, double top_p, double min_p,
                        uint64_t seed, int64_t pos) {
    cand *c;
    double *q;
    int64_t m = chain(row, n, temperature, top_k, top_p, min_p, &c, &q);
    if (m < 0) return m;
    int64_t best = 0;
    if (m > 1) { /* the noise of each survivor's id at pos, as fly_cpp.backend.sampling.uniforms (stream 0 adds nothing) */
        uint64_t key = mix64(seed * GOLDEN + (uint64_t)(pos & 0xFFFFFFFF) * MIX2);
        double top = -INFINITY;
        for (int64_t i = 0; i < m; i++) {
            uint64_t bits = mix64(key + (uint64_t)c[i].id * GOLDEN);
            double u = ((double)(bits >> 11) + 0.5) / 9007199254740992.0; /* 2^53 */
            double score = log(q[i]) + -log(-log(u));
            if (score > top) { /* the first of equal scores, as numpy's argmax */
                top = score;
                best = i;
            }
        }
    }
    int64_t token = c[best].id;
    free(c);
    free(q);
    return token;
}

/* ---- greedy runs ------------------------------------------------------------------------- */

int64_t fly_greedy_run(void *decode, void *get_logits, void *ctx, fly_llama_batch *batch, int32_t token,
                       int32_t pos, int32_t seq, int64_t n_vocab, const uint8_t *stop, int64_t n,
                       int32_t *out, int32_t *status) {
    fly_decode_fn dec = (fly_decode_fn)decode;
    fly_logits_fn logits = (fly_logits_fn)get_logits;
    const struct kernels *k = kset();
    *status = 0;
    for (int64_t i = 0; i < n; i++) {
        batch->n_tokens = 1;
        batch->token[0] = token;
        batch->pos[0] = pos + (int32_t)i;
        batch->n_seq_id[0] = 1;
        batch->seq_id[0][0] = seq;
        batch->logits[0] = 1;
        int32_t rc = dec(ctx, *batch);
        if (rc != 0) {
            *status = rc;
            return i;
        }
        const float *row = logits(ctx);
        if (!row) {
            *status = -1;
            return i;
        }
        token = (int32_t)k->argmax(row, n_vocab);
        out[i] = token;
        if (stop && stop[token]) return i + 1;
    }
    return n;
}

/* ---- greedy runs of several sequences --------------------------------------------------- */

#define FLY_MAX_RUN_SEQS 256

/* Fill the batch with sequences [lo, hi) and decode it. */
static int32_t decode_rows(fly_decode_fn dec, void *ctx, fly_llama_batch *b, int64_t lo, int64_t hi,
                           const int32_t *next, const int32_t *pos, const int32_t *seq, int64_t step) {
    for (int64_t i = lo; i < hi; i++) {
        int64_t k = i - lo;
        b->token[k] = next[i];
        b->pos[k] = pos[i] + (int32_t)step;
        b->n_seq_id[k] = 1;
        b->seq_id[k][0] = seq[i];
        b->logits[k] = 1;
    }
    b->n_tokens = (int32_t)(hi - lo);
    return dec(ctx, *b);
}

int64_t fly_greedy_runs(void *decode, void *get_logits, void *ctx, fly_llama_batch *batch, int64_t n_seqs,
                        const int32_t *token, const int32_t *pos, const int32_t *seq, const int64_t *n,
                        int32_t separate, int64_t n_vocab, const uint8_t *stop, const volatile int32_t *halt,
                        int64_t cap, int32_t *out, int64_t *got, int32_t *status) {
    fly_decode_fn dec = (fly_decode_fn)decode;
    fly_logits_fn logits = (fly_logits_fn)get_logits;
    const struct kernels *k = kset();
    int32_t next[FLY_MAX_RUN_SEQS];
    *status = 0;
    if (n_seqs < 1 || n_seqs > FLY_MAX_RUN_SEQS || n_vocab < 1) {
        *status = -2;
        return 0;
    }
    for (int64_t i = 0; i < n_seqs; i++) {
        if (n[i] < 1 || n[i] > cap) {
            *status = -2;
            return 0;
        }
        got[i] = 0;
        next[i] = token[i];
    }
    for (int64_t step = 0;; step++) {
        int64_t groups = separate ? n_seqs : 1;
        for (int64_t g = 0; g < groups; g++) {
            int64_t lo = separate ? g : 0, hi = separate ? g + 1 : n_seqs;
            int32_t rc = decode_rows(dec, ctx, batch, lo, hi, next, pos, seq, step);
            if (rc != 0) {
                *status = rc;
                return step;
            }
            const float *rows = logits(ctx);
            if (!rows) {
                *status = -1;
                return step;
            }
            for (int64_t i = lo; i < hi; i++) {
                int32_t t = (int32_t)k->argmax(rows + (i - lo) * n_vocab, n_vocab);
                out[i * cap + step] = t;
                got[i] = step + 1;
                next[i] = t;
            }
        }
        int ended = halt && *halt;
        for (int64_t i = 0; i < n_seqs && !ended; i++) ended = got[i] >= n[i] || (stop && stop[next[i]]);
        if (ended) return step + 1;
    }
}

/* ---- draft runs -------------------------------------------------------------------------- */

/* One pass: m is how many tokens before position i match the text's last tokens. */
int64_t fly_ngram_match(const int32_t *t, int64_t size, int32_t max_n, int64_t n_pred, int64_t *start) {
    if (max_n > FLY_MAX_NGRAM) max_n = FLY_MAX_NGRAM;
    if (n_pred < 1) return 0;
    int64_t top = max_n < size - 1 ? max_n : size - 1;
    int64_t first[FLY_MAX_NGRAM + 1]; /* first[m]: the earliest i after exactly m matching tokens */
    for (int64_t n = 1; n <= top; n++) first[n] = -1;
    for (int64_t i = 1; i < size && top > 0; i++) {
        if (t[i - 1] != t[size - 1]) continue;
        int64_t m = 1, most = top < i ? top : i;
        while (m < most && t[i - 1 - m] == t[size - 1 - m]) m++;
        if (first[m] < 0) first[m] = i; /* the longest m found is what counts, at its earliest */
        if (m == top) break;
    }
    for (int64_t n = top; n >= 1; n--) {
        if (first[n] >= 0) {
            *start = first[n];
            return size - first[n] < n_pred ? size - first[n] : n_pred;
        }
    }
    return 0;
}

/* Decode t[base..end) at their positions, the last `want` with logits, in batches of n_batch,
 * the last batch ending the span (Context._decode_range's split, so that rows come out the same). */
static int32_t decode_span(const fly_draft_ctx *dc, const int32_t *t, int64_t base, int64_t end, int64_t want) {
    fly_decode_fn dec = (fly_decode_fn)dc->decode;
    fly_llama_batch *b = dc->batch;
    int64_t last = end - dc->n_batch > base ? end - dc->n_batch : base;
    for (int64_t lo = base; lo < end;) {
        int64_t hi = lo < last ? (lo + dc->n_batch < last ? lo + dc->n_batch : last) : end;
        for (int64_t p = lo; p < hi; p++) {
            int64_t i = p - lo;
            b->token[i] = t[p];
            b->pos[i] = (int32_t)p;
            b->n_seq_id[i] = 1;
            b->seq_id[i][0] = dc->seq;
            b->logits[i] = p >= end - want;
        }
        b->n_tokens = (int32_t)(hi - lo);
        int32_t rc = dec(dc->ctx, *b);
        if (rc != 0) return rc;
        lo = hi;
    }
    return 0;
}

/* fly_top_probability's, the row's peak known */
static inline double top_probability_row(const struct kernels *k, const float *row, int64_t n, float peak) {
    return 1.0 / k->exp_sum_rough(row, n, peak);
}

int64_t fly_draft_run(const fly_draft_ctx *dc, const fly_draft_rules *rules, int32_t *hist, int64_t n_hist,
                      int64_t *n_done, int32_t *out, double *conf, int32_t *path_last, int32_t *status) {
    const struct kernels *k = kset();
    fly_logits_fn logits = (fly_logits_fn)dc->get_logits;
    fly_seq_rm_fn seq_rm = (fly_seq_rm_fn)dc->seq_rm;
    int64_t limit = rules->limit, size = n_hist, done = *n_done, n_out = 0;
    int want_conf = rules->confident || rules->p_min > 0;
    *status = 0;
    if (limit < 1 || n_hist < 1 || done < 0 || done >= n_hist || dc->n_batch < 1 || rules->ngram_max < 0 ||
        rules->ngram_max > FLY_MAX_NGRAM || dc->n_vocab < 1 || dc->n_vocab > dc->row_len || (want_conf && !conf) ||
        (rules->sampled && !(rules->temperature > 0.0))) {
        *status = -2;
        return 0;
    }
    while (n_out < limit) {
        /* the guess and the text's last token fit one batch */
        int64_t room = limit - n_out - 1;
        room = rules->ngram_tokens < room ? rules->ngram_tokens : room;
        room = dc->n_batch - 1 < room ? dc->n_batch - 1 : room;
        int64_t guess = 0, from = 0;
        if (rules->ngram_max > 0 && room > 0) guess = fly_ngram_match(hist, size, rules->ngram_max, room, &from);
        memmove(hist + size, hist + from, (size_t)guess * sizeof *hist); /* the guess after the text */
        int32_t rc = decode_span(dc, hist, done, size + guess, guess + 1);
        if (rc != 0) {
            *status = rc;
            break;
        }
        done = size + guess;
        const float *rows = logits(dc->ctx);
        if (!rows) {
            *status = -1;
            break;
        }
        /* the draft's token after each agreed prefix of the guess; confidences at rows 0..agree */
        int64_t agree = 0;
        int32_t token;
        double sure = 0.0;
        for (;;) {
            const float *row = rows + agree * dc->row_len;
            if (rules->sampled) {
                int64_t drawn = fly_shared_draw(row, dc->n_vocab, rules->temperature, rules->top_k, rules->top_p,
                                                rules->min_p, rules->seed, size + agree);
                if (drawn < 0) { /* the arguments were checked above: only memory can fail here */
                    *status = -4;
                    break;
                }
                token = (int32_t)drawn;
            } else {
                token = (int32_t)k->argmax(row, dc->n_vocab);
            }
            if (want_conf) /* an argmax's logit is the row's peak where it read the whole row */
                sure = top_probability_row(k, row, dc->row_len,
                                           dc->n_vocab == dc->row_len && !rules->sampled ? row[token]
                                                                                         : k->row_max(row, dc->row_len));
            if (agree < guess && token == hist[size + agree]) {
                if (want_conf) conf[n_out + agree] = sure;
                agree++;
                continue;
            }
            break;
        }
        if (*status != 0) break;
        if (size + agree < done) { /* the cache keeps the text and the agreed part of the guess */
            if (!seq_rm(dc->memory, dc->seq, (int32_t)(size + agree), -1)) {
                *status = -3;
                break;
            }
            done = size + agree;
        }
        *path_last = token;
        int64_t fresh = agree;
        if (rules->p_min <= 0 || n_out + agree < rules->need || sure >= rules->p_min) {
            hist[size + agree] = token;
            if (want_conf) conf[n_out + agree] = sure;
            fresh++;
        }
        memcpy(out + n_out, hist + size, (size_t)fresh * sizeof *out);
        int64_t end_at = -1; /* the first end-of-generation token among the fresh ones */
        for (int64_t j = 0; j < fresh && end_at < 0; j++)
            if (dc->eog[out[n_out + j]]) end_at = j;
        n_out += fresh;
        size += fresh;
        if (end_at >= 0) {
            n_out += end_at + 1 - fresh;
            break;
        }
        if (fresh == agree) break; /* the draft lost confidence */
    }
    *n_done = done;
    return n_out;
}
