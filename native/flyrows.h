/* fly-cpp native hot path: per-row reductions and sampling over llama.cpp logits rows.
 *
 * Plain C ABI, loaded from Python with ctypes (fly_cpp/backend/native.py). Every function reads
 * float32 rows in place: `x` points at row 0, row r starts at x + r * stride (stride in
 * floats, >= n), each row holds n contiguous logits. Nothing is copied, nothing is kept.
 *
 * The numpy functions in fly_cpp/backend/rows.py and fly_cpp/backend/sampling.py are the reference; these
 * must agree with them (tests/test_native_parity.py). Rows must be NaN-free and hold at
 * least one finite value; -inf entries are allowed.
 */
#ifndef FLYROWS_H
#define FLYROWS_H

#include <stdint.h>

#if defined(_WIN32)
#define FLY_API __declspec(dllexport)
#else
#define FLY_API __attribute__((visibility("default")))
#endif

/* Bumped whenever a signature or a meaning below changes; Python refuses other versions. */
#define FLY_ABI_VERSION 3

/* Largest `top` accepted by fly_top_entropy. */
#define FLY_MAX_TOP 16

#ifdef __cplusplus
extern "C" {
#endif

FLY_API int fly_abi_version(void);

/* Which row kernels run: "avx512", "avx2", "baseline" (vector extensions at the compiler's
 * default target) or "scalar". The environment variable FLY_CPP_NATIVE_ISA, read at the first
 * call, can ask for a narrower set (tests check each one). */
FLY_API const char *fly_kernels(void);

/* out[r] = index of the largest value of row r, the lowest index on ties (numpy's argmax). */
FLY_API void fly_argmax(const float *x, int64_t rows, int64_t n, int64_t stride, int64_t *out);

/* out[r] = FLy's top-`top` entropy of row r: -sum exp(l_i) * l_i over the `top` largest
 * log-softmax values l_i (not renormalised; a -inf l_i contributes 0). Returns 0, or -1 when
 * `top` is outside 1..FLY_MAX_TOP. */
FLY_API int fly_top_entropy(const float *x, int64_t rows, int64_t n, int64_t stride, int32_t top, double *out);

/* out[r] = softmax probability of the largest value of row r, to within 1e-4 relative: a
 * draft's confidence (k auto's bins, p-min) needs no more, and rough exps summed in float
 * blocks take half the time of fly_top_entropy's sum on a 152k-token row. */
FLY_API void fly_top_probability(const float *x, int64_t rows, int64_t n, int64_t stride, double *out);

/* The sampling chain of fly_cpp.backend.sampling.Sampler (top-k -> top-p -> min-p -> temperature) on
 * one row. Candidates are ordered by logit, descending, lowest id first on ties.
 * top_k <= 0 or >= n keeps all; top_p >= 1 and min_p <= 0 switch those steps off;
 * temperature must be > 0.
 *
 * fly_distribution writes the kept ids and their probabilities (in that order) when they fit
 * in `cap`, and returns how many were kept (> cap: nothing written, call again with room).
 * fly_draw returns the index picked by the uniform number u in [0, 1): the first i with
 * cumsum(probs)[i] > u * cumsum(probs)[n-1], at most n-1.
 * fly_sample is fly_distribution followed by fly_draw, returning the token id.
 * Negative returns: -1 bad arguments, -2 out of memory. */
FLY_API int64_t fly_distribution(const float *row, int64_t n, double temperature, int64_t top_k, double top_p,
                                 double min_p, int64_t *ids, double *probs, int64_t cap);
FLY_API int64_t fly_draw(const double *probs, int64_t n, double u);
FLY_API int64_t fly_sample(const float *row, int64_t n, double temperature, int64_t top_k, double top_p,
                           double min_p, double u);

/* ---- greedy runs ---------------------------------------------------------------------------
 * llama.cpp's llama_batch as include/llama.h lays it out (llama-cpp-python's ctypes binding of
 * the pinned version holds the same layout). */
typedef struct {
    int32_t n_tokens;
    int32_t *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
} fly_llama_batch;

/* llama_decode and llama_get_logits, passed in by the caller (this library does not link
 * llama.cpp). */
typedef int32_t (*fly_decode_fn)(void *ctx, fly_llama_batch batch);
typedef float *(*fly_logits_fn)(void *ctx);

/* Target-only greedy decoding without returning to Python per token: up to n times, decode
 * `token` alone at position pos + i of sequence `seq` (with its logits), take the row's argmax
 * (lowest id on ties, as fly_argmax) as out[i] and decode it next. Stops after a token whose
 * stop[token] is non-zero (stop may be NULL; it holds n_vocab entries). `batch` is the caller's
 * batch (room for one token at least). Returns how many tokens were written (each one decode);
 * *status is 0, or llama_decode's non-zero result (the decode that failed wrote nothing), or -1
 * when llama.cpp returned no logits. */
FLY_API int64_t fly_greedy_run(void *decode, void *get_logits, void *ctx, fly_llama_batch *batch, int32_t token,
                               int32_t pos, int32_t seq, int64_t n_vocab, const uint8_t *stop, int64_t n,
                               int32_t *out, int32_t *status);

/* Greedy runs of several sequences of one context at once (slots decoding with the target
 * alone): each step decodes one row per sequence, all in one llama_decode (`separate`: a
 * llama_decode per sequence, for one-row micro-batches whose rows must not depend on their
 * batch), and takes each row's argmax (as fly_argmax) as that sequence's next token. Sequence i
 * decodes token[i] at position pos[i] of sequence seq[i] first. The runs end together, after the
 * first step at which some sequence has its n[i] tokens (n[i] <= cap) or took a token whose
 * stop[token] is non-zero (stop may be NULL), or at which *halt (NULL: never) is non-zero: the
 * caller's loop then has news (a sequence to admit, one to end) before the next step. The rows
 * go into the batch in the order given (the caller orders them by sequence id). `batch` has room
 * for n_seqs tokens. Writes sequence i's tokens to out + i * cap and their count to got[i]
 * (every sequence gets as many). Returns the steps decoded; *status is 0, or llama_decode's
 * non-zero result (the failed decode wrote nothing; the sequences in it may hold part of it), or
 * -1 when llama.cpp returned no logits, or -2 for bad arguments. */
FLY_API int64_t fly_greedy_runs(void *decode, void *get_logits, void *ctx, fly_llama_batch *batch, int64_t n_seqs,
                                const int32_t *token, const int32_t *pos, const int32_t *seq, const int64_t *n,
                                int32_t separate, int64_t n_vocab, const uint8_t *stop, const volatile int32_t *halt,
                                int64_t cap, int32_t *out, int64_t *got, int32_t *status);

/* ---- draft runs ----------------------------------------------------------------------------
 * A fixed-k round of drafting with a draft model (fly_cpp.drafters.draft_model.ModelDrafter.draft,
 * the reference) without returning to Python per drafted token. */

/* llama_memory_seq_rm, passed in as llama_decode is. */
typedef uint8_t (*fly_seq_rm_fn)(void *memory, int32_t seq, int32_t p0, int32_t p1);

/* Longest n-gram looked up (fly_cpp.drafters.ngram.Index's max_n) that fly_draft_run handles. */
#define FLY_MAX_NGRAM 16

/* fly_cpp.drafters.ngram.Index.match over the text t[0..size): the continuation (up to n_pred tokens) of
 * the earliest earlier occurrence of the text's longest suffix of n <= max_n tokens (max_n is
 * capped at FLY_MAX_NGRAM) seen before; returns its length (0: none), *start where it begins. */
FLY_API int64_t fly_ngram_match(const int32_t *t, int64_t size, int32_t max_n, int64_t n_pred, int64_t *start);

/* What a draft run works on: the draft context and its batch (room for n_batch tokens), its
 * rows' length (row_len: the draft model's vocabulary) and how much of each row the argmax
 * reads (n_vocab: ids the target knows too), eog: row_len flags, a draft ends after a token
 * flagged there. */
typedef struct {
    void *decode;     /* llama_decode */
    void *get_logits; /* llama_get_logits */
    void *seq_rm;     /* llama_memory_seq_rm */
    void *ctx;
    void *memory; /* llama_get_memory(ctx) */
    fly_llama_batch *batch;
    int32_t n_batch;
    int32_t seq;
    int64_t row_len;
    int64_t n_vocab;
    const uint8_t *eog;
} fly_draft_ctx;

/* The round's rules (fly_cpp.config.SpecSettings): up to `limit` tokens, the first `need` of them
 * whatever the draft's confidence; a draft stops where the draft's top probability falls under
 * p_min (when > 0); `confident` (or p_min > 0): the top probability of each drafted token is
 * written to conf. ngram_max > 0: each step first looks up an n-gram guess (the earliest
 * continuation of the longest suffix of the text, as fly_cpp.drafters.ngram.Index.match, up to ngram_tokens
 * tokens) and checks it in the same decode.
 *
 * `sampled` non-zero: the draft's token after each prefix is drawn as the target draws its own
 * under a shared draw (fly_cpp.backend.sampling.Sampler.sample with draw "shared", no logit bias
 * or penalties): the chain (temperature, top_k, top_p, min_p, as fly_distribution) on the draft's
 * row, then the Gumbel-max draw with the noise of `seed` at the token's position in the text
 * (stream 0); else its argmax. */
typedef struct {
    int64_t limit;
    int64_t need;
    double p_min;
    int32_t confident;
    int32_t ngram_max;
    int32_t ngram_tokens;
    int32_t sampled;
    double temperature;
    int64_t top_k;
    double top_p;
    double min_p;
    uint64_t seed;
} fly_draft_rules;

/* The token that seed's shared draw takes at `pos` from a row (n entries) under the chain
 * (fly_cpp.backend.sampling.Sampler.draw's Gumbel-max: argmax of log p + G over the survivors, G
 * from the noise of (seed, pos, stream 0, token id)); < 0: fly_distribution's errors. */
FLY_API int64_t fly_shared_draw(const float *row, int64_t n, double temperature, int64_t top_k, double top_p,
                                double min_p, uint64_t seed, int64_t pos);

/* Draft after the text hist[0..n_hist) (the committed tokens), the cache holding its first
 * *n_done tokens (< n_hist): the first step decodes the rest of the text (the catch-up) with its
 * last token. hist must have room for n_hist + limit tokens: the drafted tokens are appended.
 * Writes the drafted tokens to out (room for limit) and, when asked, their confidences to conf.
 * On return *n_done is what the cache holds (hist[0..*n_done)): the text, the drafted tokens but
 * the last; *path_last the draft's own token after them (the path it drafted along). Returns how
 * many tokens were drafted; *status is 0, llama_decode's non-zero result (the cache then holds
 * hist[0..*n_done) and maybe part of the failed decode), -1 when there were no logits, -2 when
 * the arguments are outside what this function handles, -3 when llama.cpp refused a rollback,
 * -4 when a sampled draw ran out of memory. */
FLY_API int64_t fly_draft_run(const fly_draft_ctx *dc, const fly_draft_rules *rules, int32_t *hist, int64_t n_hist,
                              int64_t *n_done, int32_t *out, double *conf, int32_t *path_last, int32_t *status);

#ifdef __cplusplus
}
#endif

#endif
