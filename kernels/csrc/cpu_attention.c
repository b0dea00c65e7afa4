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

/* One work item is one sequence: its blocks are read front to back, each block's K (then V)
 * as one contiguous run of BS * Hkv * D elements, which the hardware prefetcher streams (an
 * item per (sequence, kv head) read 1/Hkv of each row and ran 2-3x slower). Within a block:
 * each K row is loaded once for the G query heads of its kv head (vector dot over D), the
 * softmax's exp runs vectorized over the block's scores, V rows update acc[head][:]. */
#define DEFINE_DECODE(NAME, T, LOAD)                                                             \
int NAME(const float *q, int64_t q_stride, const T *kc, const T *vc, const int32_t *tables,      \
         int64_t bt_stride, const int32_t *seq_lens, float *out, int B, int Hq, int Hkv, int D,  \
         int BS, float scale, int nthreads) {                                                    \
    if (D > MAX_D || BS > MAX_BS || Hq > MAX_HQ || Hq % Hkv != 0) return -1;                     \
    const int G = Hq / Hkv;                                                                      \
    const int64_t row = (int64_t)Hkv * D; /* elements of one token in a block */                 \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nthreads)")                       \
    for (int b = 0; b < B; b++) {                                                                \
        const int L = seq_lens[b];                                                               \
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
DEFINE_DECODE(pg_paged_decode_f32, float, LOAD_F32)
DEFINE_DECODE(pg_paged_decode_bf16, uint16_t, LOAD_BF16)
