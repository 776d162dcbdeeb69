/* C-level tests of flyrows: every function against a plain, obviously-correct version
 * (full scans, full sorts, double precision). Run by ctest; exit status 0 = pass. */
#include "flyrows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            failures++;                                                    \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)

static uint64_t rng_state = 88172645463325252ull;

static double uniform(void) { /* xorshift64*, [0, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static float normal(void) {
    double u = uniform() + 1e-12, v = uniform();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* a row in one of several styles: spread-out, peaked, few distinct values (ties), with -inf */
static void fill(float *x, int64_t n, int style) {
    for (int64_t i = 0; i < n; i++) {
        switch (style) {
        case 0: x[i] = 3.0f * normal(); break;
        case 1: x[i] = normal() + (uniform() < 0.001 ? 25.0f : 0.0f); break;
        case 2: x[i] = (float)(int)(4.0 * uniform()); break;
        default: x[i] = uniform() < 0.3 ? -INFINITY : 1000.0f * normal(); break;
        }
    }
    if (style == 3) x[(int64_t)(uniform() * (double)n)] = 1.0f; /* at least one finite value */
}

static int64_t ref_argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int by_value_desc(const void *a, const void *b) {
    float p = *(const float *)a, q = *(const float *)b;
    return (p < q) - (p > q);
}

static double ref_entropy(const float *x, int64_t n, int top) {
    float *s = malloc((size_t)n * sizeof *s);
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, by_value_desc);
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)x[i] - (double)s[0]);
    double lse = log(sum) + (double)s[0], h = 0.0;
    for (int i = 0; i < top && i < n; i++) {
        double l = (double)s[i] - lse;
        if (l > -INFINITY) h -= exp(l) * l;
    }
    free(s);
    return h;
}

typedef struct {
    float v;
    int64_t id;
} pair;

static int pair_order(const void *a, const void *b) {
    const pair *p = a, *q = b;
    if (p->v != q->v) return p->v > q->v ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}

/* the sampling chain the slow way: the whole row sorted (`c`, by pair_order), then cut */
static int64_t ref_sample(const pair *c, int64_t n, double t, int64_t top_k, double top_p, double min_p, double u) {
    int64_t m = top_k > 0 && top_k < n ? top_k : n;
    double *p = malloc((size_t)m * sizeof *p), s = 0.0;
    for (int64_t i = 0; i < m; i++) s += p[i] = exp((double)c[i].v - (double)c[0].v);
    int64_t keep = m;
    double cum = 0.0;
    for (int64_t i = 0; i < m; i++) {
        double pi = p[i] / s;
        cum += pi;
        if (i > 0 && ((top_p < 1.0 && !(cum - pi < top_p)) || (min_p > 0.0 && !(pi >= min_p / s)))) {
            keep = i;
            break;
        }
    }
    double total = 0.0;
    for (int64_t i = 0; i < keep; i++) total += p[i] = exp(((double)c[i].v - (double)c[0].v) / t);
    double target = u * total, acc = 0.0;
    int64_t pick = keep - 1;
    for (int64_t i = 0; i < keep; i++) {
        acc += p[i];
        if (acc > target) {
            pick = i;
            break;
        }
    }
    int64_t id = c[pick].id;
    free(p);
    return id;
}

static void test_rows(void) {
    static const int64_t sizes[] = {1, 2, 3, 7, 16, 31, 32, 33, 64, 100, 512, 1000, 32000, 151936};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int64_t n = sizes[si], rows = 3, stride = n + 5; /* a stride wider than the row, as in a view */
        float *x = malloc((size_t)(rows * stride) * sizeof *x);
        for (int style = 0; style < 4; style++) {
            for (int64_t r = 0; r < rows; r++) fill(x + r * stride, n, style);
            int64_t am[3];
            double h[3], tp[3];
            fly_argmax(x, rows, n, stride, am);
            CHECK(fly_top_entropy(x, rows, n, stride, 3, h) == 0, "n=%lld", (long long)n);
            fly_top_probability(x, rows, n, stride, tp);
            for (int64_t r = 0; r < rows; r++) {
                const float *row = x + r * stride;
                int64_t want = ref_argmax(row, n);
                CHECK(am[r] == want, "argmax n=%lld style=%d: %lld != %lld", (long long)n, style, (long long)am[r],
                      (long long)want);
                double he = ref_entropy(row, n, 3);
                CHECK(fabs(h[r] - he) <= 1e-6 * fabs(he) + 1e-9, "entropy n=%lld style=%d: %.12g != %.12g",
                      (long long)n, style, h[r], he);
                double s = 0.0;
                for (int64_t i = 0; i < n; i++) s += exp((double)row[i] - (double)row[want]);
                double pe = 1.0 / s;
                CHECK(fabs(tp[r] - pe) <= 1e-4 * pe, "top probability n=%lld: %.12g != %.12g", (long long)n, tp[r], pe);
            }
        }
        free(x);
    }
}

static void test_ties(void) {
    float x[100];
    for (int i = 0; i < 100; i++) x[i] = 1.0f;
    int64_t am;
    fly_argmax(x, 1, 100, 100, &am);
    CHECK(am == 0, "all equal: %lld", (long long)am);
    x[40] = 2.0f;
    x[70] = 2.0f;
    x[99] = 2.0f;
    fly_argmax(x, 1, 100, 100, &am);
    CHECK(am == 40, "first of three maxima: %lld", (long long)am);
    for (int i = 0; i < 100; i++) x[i] = -INFINITY;
    x[77] = -5.0f;
    fly_argmax(x, 1, 100, 100, &am);
    CHECK(am == 77, "lone finite value: %lld", (long long)am);
    double h;
    fly_top_entropy(x, 1, 100, 100, 3, &h);
    CHECK(h == 0.0, "one finite value is certain: %g", h);
    /* two equally likely tokens: H3 = ln 2 */
    x[12] = -5.0f;
    fly_top_entropy(x, 1, 100, 100, 3, &h);
    CHECK(fabs(h - log(2.0)) < 1e-7, "two-way tie: %g", h);
    CHECK(fly_top_entropy(x, 1, 100, 100, 0, &h) == -1, "top 0 refused");
    CHECK(fly_top_entropy(x, 1, 100, 100, FLY_MAX_TOP + 1, &h) == -1, "top too large refused");
}

static void test_sampling(void) {
    static const int64_t sizes[] = {1, 2, 3, 7, 64, 512, 5000, 32000};
    static const double temps[] = {0.3, 0.8, 1.5};
    static const int64_t top_ks[] = {0, 1, 5, 40, 300, 100000};
    static const double top_ps[] = {1.0, 0.95, 0.5};
    static const double min_ps[] = {0.0, 0.05};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int64_t n = sizes[si];
        float *x = malloc((size_t)n * sizeof *x);
        pair *sorted = malloc((size_t)n * sizeof *sorted);
        for (int style = 0; style < 4; style++) {
            fill(x, n, style);
            for (int64_t i = 0; i < n; i++) sorted[i] = (pair){x[i], i};
            qsort(sorted, (size_t)n, sizeof *sorted, pair_order);
            for (size_t a = 0; a < 3; a++)
                for (size_t b = 0; b < 6; b++)
                    for (size_t c = 0; c < 3; c++)
                        for (size_t d = 0; d < 2; d++) {
                            for (int trial = 0; trial < 3; trial++) {
                                double u = uniform();
                                int64_t got = fly_sample(x, n, temps[a], top_ks[b], top_ps[c], min_ps[d], u);
                                int64_t want = ref_sample(sorted, n, temps[a], top_ks[b], top_ps[c], min_ps[d], u);
                                CHECK(got == want, "sample n=%lld style=%d t=%g k=%lld p=%g minp=%g u=%.17g: %lld != %lld",
                                      (long long)n, style, temps[a], (long long)top_ks[b], top_ps[c], min_ps[d], u,
                                      (long long)got, (long long)want);
                            }
                        }
        }
        free(sorted);
        free(x);
    }
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    CHECK(fly_sample(x, 4, 0.0, 0, 1.0, 0.0, 0.5) == -1, "temperature 0 refused");
    CHECK(fly_sample(x, 4, 1.0, 0, 1.0, 0.0, 0.0) == 0, "u = 0 picks the first");
    CHECK(fly_sample(x, 4, 1.0, 0, 1.0, 0.0, 0.9999) == 3, "u near 1 picks the last");
    CHECK(fly_sample(x, 4, 1.0, 0, 1.0, 0.0, 0.5) == 2, "uniform ties in id order");
    int64_t ids[4];
    double probs[4];
    CHECK(fly_distribution(x, 4, 1.0, 2, 1.0, 0.0, ids, probs, 4) == 2, "top-k 2 keeps 2");
    CHECK(ids[0] == 0 && ids[1] == 1 && probs[0] == 0.5, "ties keep the lowest ids");
    CHECK(fly_distribution(x, 4, 1.0, 0, 1.0, 0.0, ids, probs, 1) == 4, "count reported past cap");
    double p[3] = {0.25, 0.0, 0.75};
    CHECK(fly_draw(p, 3, 0.25) == 2, "a zero-probability entry is never drawn");
    CHECK(fly_draw(p, 3, 0.2499) == 0, "first bucket");
}

/* A stand-in for llama.cpp: a "model" whose next token after t is (3 t + 1) mod V, with ties
 * resolved to the lowest id; decode fails (returns 1) at position fail_at. */
#define RUN_V 97
static float run_row[RUN_V];
static int32_t run_seen[64], run_pos[64], run_n = 0, run_fail_at = -1;

static int32_t fake_decode(void *ctx, fly_llama_batch b) {
    (void)ctx;
    if (b.n_tokens != 1 || b.n_seq_id[0] != 1 || b.seq_id[0][0] != 5 || !b.logits[0]) return 3;
    if (b.pos[0] == run_fail_at) return 1;
    run_seen[run_n] = b.token[0];
    run_pos[run_n++] = b.pos[0];
    for (int i = 0; i < RUN_V; i++) run_row[i] = 0.0f;
    int next = (3 * b.token[0] + 1) % RUN_V;
    run_row[next] = 2.0f;
    run_row[(next + 1) % RUN_V] = 2.0f; /* a tie: the lower id wins (or id 0 after wrapping) */
    return 0;
}

static float *fake_logits(void *ctx) {
    (void)ctx;
    return run_row;
}

static void test_greedy_run(void) {
    int32_t tok[1], pos[1], nseq[1], seq0[1], *seq[1] = {seq0}, out[16], status = 9;
    int8_t logits[1];
    fly_llama_batch b = {0, tok, NULL, pos, nseq, seq, logits};
    uint8_t stop[RUN_V] = {0};
    int64_t got = fly_greedy_run((void *)fake_decode, (void *)fake_logits, NULL, &b, 2, 10, 5, RUN_V, NULL, 6,
                                 out, &status);
    CHECK(got == 6 && status == 0, "run of 6: %lld, status %d", (long long)got, status);
    int32_t t = 2;
    for (int i = 0; i < 6; i++) {
        int next = (3 * t + 1) % RUN_V, want = next == RUN_V - 1 ? 0 : next;
        CHECK(run_seen[i] == t && run_pos[i] == 10 + i, "decode %d: token %d at %d", i, run_seen[i], run_pos[i]);
        CHECK(out[i] == want, "pick %d: %d != %d", i, out[i], want);
        t = out[i];
    }
    run_n = 0;
    stop[out[2]] = 1; /* an end-of-generation token ends the run after it */
    got = fly_greedy_run((void *)fake_decode, (void *)fake_logits, NULL, &b, 2, 10, 5, RUN_V, stop, 6, out, &status);
    CHECK(got == 3 && status == 0 && run_n == 3, "stop mark: %lld tokens, %d decodes", (long long)got, run_n);
    run_n = 0;
    run_fail_at = 12; /* the third decode fails: two tokens, the status passed on */
    got = fly_greedy_run((void *)fake_decode, (void *)fake_logits, NULL, &b, 2, 10, 5, RUN_V, NULL, 6, out, &status);
    CHECK(got == 2 && status == 1 && run_n == 2, "failed decode: %lld tokens, status %d", (long long)got, status);
    run_fail_at = -1;
}

/* Several sequences: the fake model's next token after t in sequence s is (3 t + 1 + s) mod V
 * (no ties); rows come back in batch order. */
static float runs_rows[8 * RUN_V];
static int32_t runs_decodes = 0, runs_rows_seen = 0;

static int32_t fake_decode_seqs(void *ctx, fly_llama_batch b) {
    (void)ctx;
    runs_decodes++;
    for (int r = 0; r < b.n_tokens; r++) {
        if (b.n_seq_id[r] != 1 || !b.logits[r]) return 3;
        int s = b.seq_id[r][0];
        float *row = runs_rows + r * RUN_V;
        for (int i = 0; i < RUN_V; i++) row[i] = 0.0f;
        row[(3 * b.token[r] + 1 + s) % RUN_V] = 1.0f;
        runs_rows_seen++;
    }
    return 0;
}

static float *fake_logits_seqs(void *ctx) {
    (void)ctx;
    return runs_rows;
}

static void test_greedy_runs(void) {
    int32_t tok[4], pos[4], nseq[4], s0[4], *seqp[4] = {&s0[0], &s0[1], &s0[2], &s0[3]};
    int8_t logits[4];
    fly_llama_batch b = {0, tok, NULL, pos, nseq, seqp, logits};
    int32_t token[3] = {2, 5, 7}, at[3] = {10, 0, 4}, seq[3] = {0, 1, 3}, out[3 * 8], status = 9, halt = 0;
    int64_t n[3] = {6, 5, 4}, got[3];
    uint8_t stop[RUN_V] = {0};
    for (int separate = 0; separate < 2; separate++) {
        runs_decodes = runs_rows_seen = 0;
        int64_t steps = fly_greedy_runs((void *)fake_decode_seqs, (void *)fake_logits_seqs, NULL, &b, 3, token, at, seq,
                                        n, separate, RUN_V, NULL, NULL, 8, out, got, &status);
        CHECK(steps == 4 && status == 0, "runs end with the shortest: %lld steps, status %d", (long long)steps, status);
        CHECK(runs_rows_seen == 12, "rows decoded: %d", runs_rows_seen);
        CHECK(runs_decodes == (separate ? 12 : 4), "decodes: %d", runs_decodes);
        for (int i = 0; i < 3; i++) {
            CHECK(got[i] == 4, "sequence %d got %lld", i, (long long)got[i]);
            int32_t t = token[i];
            for (int j = 0; j < got[i]; j++) {
                int32_t want = (3 * t + 1 + seq[i]) % RUN_V;
                CHECK(out[i * 8 + j] == want, "seq %d token %d: %d != %d", i, j, out[i * 8 + j], want);
                t = want;
            }
        }
    }
    stop[out[1 * 8 + 1]] = 1; /* sequence 1's second token ends every run after that step */
    int64_t steps = fly_greedy_runs((void *)fake_decode_seqs, (void *)fake_logits_seqs, NULL, &b, 3, token, at, seq, n,
                                    0, RUN_V, stop, NULL, 8, out, got, &status);
    CHECK(steps == 2 && got[0] == 2 && got[2] == 2, "stop: %lld steps", (long long)steps);
    halt = 1; /* news for the caller: one step */
    steps = fly_greedy_runs((void *)fake_decode_seqs, (void *)fake_logits_seqs, NULL, &b, 3, token, at, seq, n, 0,
                            RUN_V, NULL, &halt, 8, out, got, &status);
    CHECK(steps == 1 && got[1] == 1, "halt: %lld steps", (long long)steps);
    n[0] = 9;
    CHECK(fly_greedy_runs((void *)fake_decode_seqs, (void *)fake_logits_seqs, NULL, &b, 3, token, at, seq, n, 0, RUN_V,
                          NULL, NULL, 8, out, got, &status) == 0 && status == -2, "n past cap refused");
}

int main(void) {
    CHECK(fly_abi_version() == FLY_ABI_VERSION, "abi %d", fly_abi_version());
    test_rows();
    test_ties();
    test_sampling();
    test_greedy_run();
    test_greedy_runs();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("flyrows (%s kernels): all checks passed\n", fly_kernels());
    return 0;
}
