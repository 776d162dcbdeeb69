/* fly-cpp native hot path: per-row reductions and sampling over llama.cpp logits rows.
 * See flyrows.h for the contract. Written in plain C11 so that -O3 vectorises the loops
 * over a row: each hot loop keeps LANES independent accumulators (a lane-wise operation, not
 * a reduction, so no -ffast-math is needed), and folds the lanes once at the end. */
#include "flyrows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* On x86-64 Linux with GCC, the row loops are also compiled for AVX2+FMA and picked at load
 * time (ifunc), so the default build stays portable and still uses the wider registers. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(FLY_NO_CLONES)
#define FLY_HOT __attribute__((target_clones("arch=haswell", "default")))
#else
#define FLY_HOT
#endif

#define LANES 16
#define BLOCK 64 /* floats per block when skipping blocks that cannot change a top-k list */

int fly_abi_version(void) { return FLY_ABI_VERSION; }

/* ---- argmax ------------------------------------------------------------------------------ */

FLY_HOT static int64_t argmax_row(const float *x, int64_t n) {
    int64_t i = 0, best_i = 0;
    float best = x[0];
    if (n >= 2 * LANES && n <= INT32_MAX) {
        /* lane j sees x[j], x[j + LANES], ...: strict > keeps each lane's first maximum */
        float bv[LANES];
        int32_t bi[LANES];
        for (int j = 0; j < LANES; j++) {
            bv[j] = x[j];
            bi[j] = j;
        }
        for (i = LANES; i + LANES <= n; i += LANES) {
            for (int j = 0; j < LANES; j++) {
                float v = x[i + j];
                int gt = v > bv[j];
                bv[j] = gt ? v : bv[j];
                bi[j] = gt ? (int32_t)(i + j) : bi[j];
            }
        }
        best = bv[0];
        best_i = bi[0];
        for (int j = 1; j < LANES; j++) {
            if (bv[j] > best || (bv[j] == best && bi[j] < best_i)) {
                best = bv[j];
                best_i = bi[j];
            }
        }
    }
    for (; i < n; i++) { /* the tail (or a short row): later indices win only when strictly larger */
        if (x[i] > best) {
            best = x[i];
            best_i = i;
        }
    }
    return best_i;
}

void fly_argmax(const float *x, int64_t rows, int64_t n, int64_t stride, int64_t *out) {
    for (int64_t r = 0; r < rows; r++) out[r] = n > 0 ? argmax_row(x + r * stride, n) : 0;
}

/* ---- exp-sum ----------------------------------------------------------------------------- */

/* expf for x <= 0, vectorisable (Cephes' polynomial, about 1 ulp): e^x = 2^k * e^r with
 * |r| <= ln2/2. Returns 0 below -87.3 (e^x is then under FLT_MIN) and for -inf. */
static inline float exp_nonpos(float x) {
    const float lo = -87.3f;
    float xc = x < lo ? lo : x;
    float t = xc * 1.44269504088896341f;
    float k = (t + 12582912.0f) - 12582912.0f; /* round to nearest (|t| < 2^22) */
    float r = xc - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23; /* k in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < lo ? 0.0f : y * scale;
}

/* sum of exp(x[i] - peak) in double; exp in float32 like the numpy reference's np.exp. */
FLY_HOT static double exp_sum(const float *x, int64_t n, float peak) {
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) acc[j] += (double)exp_nonpos(x[i + j] - peak);
    }
    double s = 0.0;
    for (; i < n; i++) s += (double)exp_nonpos(x[i] - peak);
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

FLY_HOT static float block_max(const float *x, int64_t n) {
    float m[LANES];
    int64_t i = 0;
    float best = x[0];
    if (n >= LANES) {
        for (int j = 0; j < LANES; j++) m[j] = x[j];
        for (i = LANES; i + LANES <= n; i += LANES) {
            for (int j = 0; j < LANES; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
        }
        best = m[0];
        for (int j = 1; j < LANES; j++) best = m[j] > best ? m[j] : best;
    }
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    return best;
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
        if (have == top && !(block_max(x + i, len) > best[top - 1])) continue;
        for (int64_t j = 0; j < len; j++) top_insert(best, &have, top, x[i + j]);
    }
    return have;
}

static double top_entropy_row(const float *x, int64_t n, int top) {
    float best[FLY_MAX_TOP];
    int have = top_values(x, n, top, best);
    float peak = best[0];
    double lse = log(exp_sum(x, n, peak)) + (double)peak;
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
        out[r] = n > 0 ? 1.0 / exp_sum(row, n, block_max(row, n)) : NAN;
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
        if (have == k && !(block_max(x + i, len) > c[k - 1].v)) continue;
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
    float peak = block_max(x, n);
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
