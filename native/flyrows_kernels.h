/* The five loops over a whole row (max, argmax, "any above t", sum of exp, and a rough sum of exp), written with GCC/Clang vector extensions. flyrows.c
 * includes this file once per instruction set, with KW (floats per vector), K(name) (name
 * suffix) and KNAME defined, under a target pragma; hence no include guard. Two vectors per step keep
 * two independent dependency chains in flight. Results do not depend on KW except for the
 * order of exp_sum's double additions and of exp_sum_rough's float ones. */

typedef float K(vf) __attribute__((vector_size(KW * 4)));
typedef int32_t K(vi) __attribute__((vector_size(KW * 4)));
typedef float K(vfu) __attribute__((vector_size(KW * 4), aligned(4), may_alias));
typedef float K(vh) __attribute__((vector_size(KW * 2)));  /* half a vector */
typedef double K(vd) __attribute__((vector_size(KW * 4))); /* half a vector, widened */

static inline __attribute__((always_inline)) K(vf) K(load)(const float *x) { return *(const K(vfu) *)x; }

static inline __attribute__((always_inline)) int K(any)(K(vi) m) {
    int32_t r = 0;
    for (int j = 0; j < KW; j++) r |= m[j];
    return r != 0;
}

/* e^x for x <= 0, lane-wise: exp_nonpos of flyrows.c, the same operations. */
static inline __attribute__((always_inline)) K(vf) K(exp)(K(vf) x) {
    K(vi) low = x < EXP_LO;                 /* -1 where e^x underflows to 0 */
    K(vf) xc = (K(vf))((K(vi))x & ~low);    /* those lanes compute e^0, masked off at the end */
    K(vf) k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    K(vf) r = xc - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    K(vf) p;
    EXP_POLY(p, r)
    K(vf) y = p * r * r + r + 1.0f;
    K(vi) bits = (__builtin_convertvector(k, K(vi)) + 127) << 23;
    return (K(vf))((K(vi))(y * (K(vf))bits) & ~low);
}

/* e^x for x <= 0 to about 5e-5 relative, for sums that need no more (a draft's confidence): the
 * range reduction of K(exp) in one step and a degree-4 polynomial; x at or below -87 gives
 * e^-87 (~1.6e-38), not 0. */
static inline __attribute__((always_inline)) K(vf) K(exp_rough)(K(vf) x) {
    K(vi) low = x < -87.0f; /* -inf included */
    K(vf) floor = (K(vf)){0} - 87.0f;
    x = (K(vf))(((K(vi))x & ~low) | ((K(vi))floor & low));
    K(vf) k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    K(vf) r = x - k * 0.693147180559945f;
    K(vf) p = (r * 4.1666666e-2f + 1.6666667e-1f) * r + 0.5f;
    K(vf) y = p * r * r + r + 1.0f;
    K(vi) bits = (__builtin_convertvector(k, K(vi)) + 127) << 23;
    return y * (K(vf))bits;
}

static float K(row_max)(const float *x, int64_t n) {
    int64_t i = 0;
    float best = x[0];
    if (n >= 2 * KW) {
        K(vf) a = K(load)(x), b = K(load)(x + KW);
        for (i = 2 * KW; i + 2 * KW <= n; i += 2 * KW) {
            K(vf) u = K(load)(x + i), v = K(load)(x + i + KW);
            K(vi) gu = u > a, gv = v > b;
            a = (K(vf))(((K(vi))u & gu) | ((K(vi))a & ~gu));
            b = (K(vf))(((K(vi))v & gv) | ((K(vi))b & ~gv));
        }
        for (int j = 0; j < KW; j++) {
            best = a[j] > best ? a[j] : best;
            best = b[j] > best ? b[j] : best;
        }
    }
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    return best;
}

static inline __attribute__((always_inline)) K(vf) K(max)(K(vf) a, K(vf) b) {
    K(vi) g = b > a;
    return (K(vf))(((K(vi))b & g) | ((K(vi))a & ~g));
}

/* index of the first maximum, in one pass over chunks of 4 vectors: each lane keeps its
 * maximum and the first chunk where it reached it; the earliest chunk holding the overall
 * maximum is then scanned for its first position */
static int64_t K(argmax)(const float *x, int64_t n) {
    const int64_t C = 4 * KW;
    int64_t i = 0, best_i = 0;
    float best = x[0];
    if (n >= C && n / C <= INT32_MAX) {
        K(vf) a = K(max)(K(max)(K(load)(x), K(load)(x + KW)), K(max)(K(load)(x + 2 * KW), K(load)(x + 3 * KW)));
        K(vi) at = {0}, chunk = {0}, one;
        for (int j = 0; j < KW; j++) one[j] = 1;
        for (i = C; i + C <= n; i += C) {
            chunk += one;
            K(vf) m = K(max)(K(max)(K(load)(x + i), K(load)(x + i + KW)),
                             K(max)(K(load)(x + i + 2 * KW), K(load)(x + i + 3 * KW)));
            K(vi) g = m > a;
            a = (K(vf))(((K(vi))m & g) | ((K(vi))a & ~g));
            at = (chunk & g) | (at & ~g);
        }
        int32_t first = at[0];
        best = a[0];
        for (int j = 1; j < KW; j++) {
            if (a[j] > best || (a[j] == best && at[j] < first)) {
                best = a[j];
                first = at[j];
            }
        }
        const float *c = x + (int64_t)first * C;
        for (int64_t j = 0; j < C; j++) {
            if (c[j] == best) {
                best_i = (int64_t)first * C + j;
                break;
            }
        }
    }
    for (; i < n; i++) { /* the tail: later indices win only when strictly larger */
        if (x[i] > best) {
            best = x[i];
            best_i = i;
        }
    }
    return best_i;
}

static int K(any_above)(const float *x, int64_t n, float t) {
    int64_t i = 0;
    K(vi) m = {0};
    for (; i + 2 * KW <= n; i += 2 * KW) m |= (K(load)(x + i) > t) | (K(load)(x + i + KW) > t);
    if (K(any)(m)) return 1;
    for (; i < n; i++)
        if (x[i] > t) return 1;
    return 0;
}

/* sum of exp(x[i] - peak): float32 exps (like numpy's np.exp on float32 logits), each widened
 * and added in double (a float partial sum would drop the small terms next to the peak's 1). */
static inline __attribute__((always_inline)) void K(widen_add)(K(vd) *lo, K(vd) *hi, K(vf) e) {
    K(vh) a, b;
    memcpy(&a, &e, sizeof a);
    memcpy(&b, (const char *)&e + sizeof a, sizeof b);
    *lo += __builtin_convertvector(a, K(vd));
    *hi += __builtin_convertvector(b, K(vd));
}

static double K(exp_sum)(const float *x, int64_t n, float peak) {
    K(vd) s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t i = 0;
    for (; i + 2 * KW <= n; i += 2 * KW) {
        K(widen_add)(&s0, &s1, K(exp)(K(load)(x + i) - peak));
        K(widen_add)(&s2, &s3, K(exp)(K(load)(x + i + KW) - peak));
    }
    double s = 0.0;
    for (; i < n; i++) s += (double)exp_nonpos(x[i] - peak);
    for (int j = 0; j < KW / 2; j++) s += (s0[j] + s1[j]) + (s2[j] + s3[j]);
    return s;
}

/* exp_sum to about 1e-4 relative in half its time: rough exps, added in float 16 vectors at a
 * time (no lane's float sum then holds more than 16 terms) and the block sums widened to double. */
static double K(exp_sum_rough)(const float *x, int64_t n, float peak) {
    K(vd) s0 = {0}, s1 = {0};
    int64_t i = 0;
    while (i + 2 * KW <= n) {
        K(vf) a = {0}, b = {0};
        int64_t end = i + 16 * KW < n ? i + 16 * KW : n;
        for (; i + 2 * KW <= end; i += 2 * KW) {
            a += K(exp_rough)(K(load)(x + i) - peak);
            b += K(exp_rough)(K(load)(x + i + KW) - peak);
        }
        K(widen_add)(&s0, &s1, a + b);
    }
    double s = 0.0;
    for (; i < n; i++) s += (double)exp_nonpos(x[i] - peak);
    for (int j = 0; j < KW / 2; j++) s += s0[j] + s1[j];
    return s;
}

static const struct kernels K(kernels) = {.row_max = K(row_max), .argmax = K(argmax), .any_above = K(any_above),
                                        .exp_sum = K(exp_sum), .exp_sum_rough = K(exp_sum_rough),
                                        .name = KNAME};
