/* Paged decode attention for the CPU: one new query token per sequence attends to its whole
 * context, read straight from the paged KV cache through the block table (no gather copy).
 *
 *   q        [B, Hq, D]  (token stride q_stride)      key/value cache [num_blocks, BS, Hkv, D]
 *   tables   [B, bt_stride] int32 block ids           seq_lens [B] int32 (context incl. the token)
 *   out      [B, Hq, D]  (contiguous)
 *
 * Online softmax in fp32 (running max, running sum), as in FlashAttention.
 * Built at first use by kernels/native.py (gcc -O3 -march=native -fopenmp); called through
 * ctypes, which releases the GIL for the call.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_math.h"

#define MAX_D 256
#define MAX_HQ 64
#define MAX_BS 64

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* exp of a block's scores (all <= 0: scores minus their running max); below -87 -> 0. */
static inline void exp_inplace(float *x, int n) {
    _Pragma("omp simd")
    for (int i = 0; i < n; i++) x[i] = x[i] < -87.f ? 0.f : pg_exp(x[i]);
}


/* ---- the vector fast path: head_dim 64 or 128, up to 4 query heads per kv head -------------
 * One sequence at a time, its blocks in chunks of CHUNK: for each kv head the G query rows and
 * their accumulators live in vector registers (GCC vector extensions: AVX-512 here, narrower
 * ISAs get the same code split), each K row gives G dot products, each V row G axpys. The
 * chunk's K/V (CHUNK * BS * Hkv * D elements) stays in L2 while the kv heads take turns. */
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
#define CHUNK 8

static inline v16 ld_f32(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline v16 ld_bf16(const uint16_t *p) {
    u16x16 h; memcpy(&h, p, sizeof h);
    u32x16 w = __builtin_convertvector(h, u32x16) << 16;
    v16 v; memcpy(&v, &w, sizeof v); return v;
}
static inline float hsum(v16 v) {
    v += __builtin_shuffle(v, (i16v){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    v += __builtin_shuffle(v, (i16v){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    v += __builtin_shuffle(v, (i16v){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    v += __builtin_shuffle(v, (i16v){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    return v[0];
}

#define DEFINE_FAST(FN, T, LD, NV, G)                                                            \
static void FN(const float *q, const T *kc, const T *vc, const int32_t *table, int L, float *out, \
               int Hkv, int BS, float scale) {                                                   \
    const int D = NV * 16;                                                                       \
    const int64_t row = (int64_t)Hkv * D;                                                        \
    v16 acc_all[MAX_HQ][NV];                                                                     \
    float m_all[MAX_HQ], l_all[MAX_HQ];                                                          \
    for (int i = 0; i < Hkv * G; i++) {                                                          \
        for (int j = 0; j < NV; j++) acc_all[i][j] = (v16){0};                                   \
        m_all[i] = -INFINITY; l_all[i] = 0.f;                                                    \
    }                                                                                            \
    for (int c0 = 0; c0 < L; c0 += CHUNK * BS) {                                                 \
        const int c1 = c0 + CHUNK * BS < L ? c0 + CHUNK * BS : L;                                \
        for (int h = 0; h < Hkv; h++) {                                                          \
            v16 qr[G][NV], acc[G][NV];                                                           \
            float m[G], l[G];                                                                    \
            for (int g = 0; g < G; g++) {                                                        \
                for (int j = 0; j < NV; j++) {                                                   \
                    qr[g][j] = ld_f32(q + (h * G + g) * D + 16 * j) * scale;                     \
                    acc[g][j] = acc_all[h * G + g][j];                                           \
                }                                                                                \
                m[g] = m_all[h * G + g]; l[g] = l_all[h * G + g];                                \
            }                                                                                    \
            for (int start = c0; start < c1; start += BS) {                                      \
                const int n = c1 - start < BS ? c1 - start : BS;                                 \
                const int64_t base = (int64_t)table[start / BS] * BS * row + (int64_t)h * D;     \
                float s[G][MAX_BS];                                                              \
                for (int t = 0; t < n; t++) {                                                    \
                    const T *k = kc + base + t * row;                                            \
                    v16 kv[NV];                                                                  \
                    for (int j = 0; j < NV; j++) kv[j] = LD(k + 16 * j);                         \
                    for (int g = 0; g < G; g++) {                                                \
                        v16 p = qr[g][0] * kv[0];                                                \
                        for (int j = 1; j < NV; j++) p += qr[g][j] * kv[j];                      \
                        s[g][t] = hsum(p);                                                       \
                    }                                                                            \
                }                                                                                \
                for (int g = 0; g < G; g++) {                                                    \
                    float mx = m[g];                                                             \
                    for (int t = 0; t < n; t++) mx = s[g][t] > mx ? s[g][t] : mx;                \
                    const float corr = m[g] == -INFINITY ? 0.f : pg_exp(m[g] - mx);              \
                    float sum = 0.f;                                                             \
                    _Pragma("omp simd reduction(+:sum)")                                         \
                    for (int t = 0; t < n; t++) {                                                \
                        const float x = s[g][t] - mx;                                            \
                        s[g][t] = x < -87.f ? 0.f : pg_exp(x);                                   \
                        sum += s[g][t];                                                          \
                    }                                                                            \
                    l[g] = l[g] * corr + sum;                                                    \
                    for (int j = 0; j < NV; j++) acc[g][j] *= corr;                              \
                    m[g] = mx;                                                                   \
                }                                                                                \
                for (int t = 0; t < n; t++) {                                                    \
                    const T *v = vc + base + t * row;                                            \
                    v16 vv[NV];                                                                  \
                    for (int j = 0; j < NV; j++) vv[j] = LD(v + 16 * j);                         \
                    for (int g = 0; g < G; g++) {                                                \
                        const float p = s[g][t];                                                 \
                        for (int j = 0; j < NV; j++) acc[g][j] += p * vv[j];                     \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
            for (int g = 0; g < G; g++) {                                                        \
                for (int j = 0; j < NV; j++) acc_all[h * G + g][j] = acc[g][j];                  \
                m_all[h * G + g] = m[g]; l_all[h * G + g] = l[g];                                \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    for (int i = 0; i < Hkv * G; i++) {                                                          \
        const float inv = l_all[i] > 0.f ? 1.f / l_all[i] : 0.f;                                 \
        for (int j = 0; j < NV; j++) {                                                           \
            const v16 o = acc_all[i][j] * inv;                                                   \
            memcpy(out + i * D + 16 * j, &o, sizeof o);                                          \
        }                                                                                        \
    }                                                                                            \
}

typedef void (*fast_fn_f32)(const float *, const float *, const float *, const int32_t *, int, float *, int, int, float);
typedef void (*fast_fn_bf16)(const float *, const uint16_t *, const uint16_t *, const int32_t *, int, float *, int,
                             int, float);
#define DEFINE_FAST_SET(T, LD, SUF)                                                              \
    DEFINE_FAST(fast_##SUF##_4_1, T, LD, 4, 1) DEFINE_FAST(fast_##SUF##_4_2, T, LD, 4, 2)          \
    DEFINE_FAST(fast_##SUF##_4_3, T, LD, 4, 3) DEFINE_FAST(fast_##SUF##_4_4, T, LD, 4, 4)          \
    DEFINE_FAST(fast_##SUF##_8_1, T, LD, 8, 1) DEFINE_FAST(fast_##SUF##_8_2, T, LD, 8, 2)          \
    DEFINE_FAST(fast_##SUF##_8_4, T, LD, 8, 4)                                                   \
    static fast_fn_##SUF pick_##SUF(int D, int G) {                                              \
        if (D == 64) return G == 1 ? fast_##SUF##_4_1 : G == 2 ? fast_##SUF##_4_2                 \
                          : G == 3 ? fast_##SUF##_4_3 : G == 4 ? fast_##SUF##_4_4 : 0;            \
        if (D == 128) return G == 1 ? fast_##SUF##_8_1 : G == 2 ? fast_##SUF##_8_2                \
                           : G == 4 ? fast_##SUF##_8_4 : 0;                                       \
        return 0;                                                                                \
    }
DEFINE_FAST_SET(float, ld_f32, f32)
DEFINE_FAST_SET(uint16_t, ld_bf16, bf16)

/* The generic path. One work item is one sequence: its blocks are read front to back, each block's K (then V)
 * as one contiguous run of BS * Hkv * D elements, which the hardware prefetcher streams (an
 * item per (sequence, kv head) read 1/Hkv of each row and ran 2-3x slower). Within a block:
 * each K row is loaded once for the G query heads of its kv head (vector dot over D), the
 * softmax's exp runs vectorized over the block's scores, V rows update acc[head][:]. */
#define DEFINE_DECODE(NAME, T, LOAD, SUF)                                                             \
int NAME(const float *q, int64_t q_stride, const T *kc, const T *vc, const int32_t *tables,      \
         int64_t bt_stride, const int32_t *seq_lens, float *out, int B, int Hq, int Hkv, int D,  \
         int BS, float scale, int nthreads) {                                                    \
    if (D > MAX_D || BS > MAX_BS || Hq > MAX_HQ || Hq % Hkv != 0) return -1;                     \
    const int G = Hq / Hkv;                                                                      \
    const int64_t row = (int64_t)Hkv * D; /* elements of one token in a block */                 \
    const fast_fn_##SUF fast = pick_##SUF(D, G);                                                 \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nthreads)")                       \
    for (int b = 0; b < B; b++) {                                                                \
        const int L = seq_lens[b];                                                               \
        if (fast) {                                                                              \
            fast(q + (int64_t)b * q_stride, kc, vc, tables + (int64_t)b * bt_stride, L,           \
                 out + (int64_t)b * Hq * D, Hkv, BS, scale);                                     \
            continue;                                                                            \
        }                                                                                        \
        float qv[MAX_HQ][MAX_D] __attribute__((aligned(64)));                                    \
        float acc[MAX_HQ][MAX_D] __attribute__((aligned(64)));                                   \
        float sc[MAX_HQ][MAX_BS] __attribute__((aligned(64)));                                   \
        float m[MAX_HQ], l[MAX_HQ];                                                              \
        for (int hq = 0; hq < Hq; hq++) {                                                        \
            const float *src = q + (int64_t)b * q_stride + (int64_t)hq * D;                      \
            for (int d = 0; d < D; d++) { qv[hq][d] = src[d] * scale; acc[hq][d] = 0.f; }        \
            m[hq] = -INFINITY; l[hq] = 0.f;                                                      \
        }                                                                                        \
        for (int start = 0; start < L; start += BS) {                                            \
            const int n = L - start < BS ? L - start : BS;                                       \
            const int64_t base = (int64_t)tables[(int64_t)b * bt_stride + start / BS] * BS * row;  \
            if (start + BS < L) { /* the whole next block, while this one computes */          \
                const int64_t nxt = (int64_t)tables[(int64_t)b * bt_stride + start / BS + 1] * BS * row; \
                for (int c = 0; c < BS * Hkv * D * (int)sizeof(T) / 64; c++) {                                                  \
                    __builtin_prefetch(kc + nxt + c * (64 / sizeof(T)));                         \
                    __builtin_prefetch(vc + nxt + c * (64 / sizeof(T)));                         \
                }                                                                                \
            }                                                                                    \
            for (int t = 0; t < n; t++) {                                                        \
                for (int h = 0; h < Hkv; h++) {                                                  \
                    const T *k = kc + base + t * row + h * D;                                    \
                    float kt[MAX_D] __attribute__((aligned(64)));                                \
                    for (int d = 0; d < D; d++) kt[d] = LOAD(k[d]);                              \
                    for (int g = 0; g < G; g++) {                                                \
                        const float *qq = qv[h * G + g];                                         \
                        float dot = 0.f;                                                         \
                        _Pragma("omp simd reduction(+:dot)")                                     \
                        for (int d = 0; d < D; d++) dot += qq[d] * kt[d];                        \
                        sc[h * G + g][t] = dot;                                                  \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
            for (int hq = 0; hq < Hq; hq++) {                                                    \
                float *s = sc[hq];                                                               \
                float mx = m[hq];                                                                \
                for (int t = 0; t < n; t++) mx = s[t] > mx ? s[t] : mx;                          \
                const float corr = m[hq] == -INFINITY ? 0.f : expf(m[hq] - mx);                  \
                for (int t = 0; t < n; t++) s[t] -= mx;                                          \
                exp_inplace(s, n);                                                               \
                float sum = 0.f;                                                                 \
                for (int t = 0; t < n; t++) sum += s[t];                                         \
                l[hq] = l[hq] * corr + sum;                                                      \
                if (corr != 1.f) {                                                               \
                    _Pragma("omp simd")                                                          \
                    for (int d = 0; d < D; d++) acc[hq][d] *= corr;                              \
                }                                                                                \
                m[hq] = mx;                                                                      \
            }                                                                                    \
            for (int t = 0; t < n; t++) {                                                        \
                for (int h = 0; h < Hkv; h++) {                                                  \
                    const T *v = vc + base + t * row + h * D;                                    \
                    float vt[MAX_D] __attribute__((aligned(64)));                                \
                    for (int d = 0; d < D; d++) vt[d] = LOAD(v[d]);                              \
                    for (int g = 0; g < G; g++) {                                                \
                        const float p = sc[h * G + g][t];                                        \
                        float *a = acc[h * G + g];                                               \
                        _Pragma("omp simd")                                                      \
                        for (int d = 0; d < D; d++) a[d] += p * vt[d];                           \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int hq = 0; hq < Hq; hq++) {                                                        \
            float *dst = out + ((int64_t)b * Hq + hq) * D;                                       \
            const float inv = l[hq] > 0.f ? 1.f / l[hq] : 0.f;                                   \
            for (int d = 0; d < D; d++) dst[d] = acc[hq][d] * inv;                               \
        }                                                                                        \
    }                                                                                            \
    return 0;                                                                                    \
}

#define LOAD_F32(x) (x)
#define LOAD_BF16(x) bf16_to_f32(x)
DEFINE_DECODE(pg_paged_decode_f32, float, LOAD_F32, f32)
DEFINE_DECODE(pg_paged_decode_bf16, uint16_t, LOAD_BF16, bf16)
