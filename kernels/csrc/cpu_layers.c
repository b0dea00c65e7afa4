/* Fused fp32 element-wise layers for the CPU path, each one pass over its rows instead of the
 * 4-8 separate torch ops (and their temporaries) that express it in Python:
 *
 *   pg_add_rms_norm   residual += x;  out = residual * rsqrt(mean(residual^2) + eps) * weight
 *   pg_rms_norm       out = x * rsqrt(mean(x^2) + eps) * weight
 *   pg_silu_mul       out[t, :] = silu(gu[t, :I]) * gu[t, I:]
 *   pg_rope_cache     rotate q and k of the fused QKV rows (half-split RoPE), write q to q_out
 *                     and k, v straight into their paged-cache slots (slot -1: skipped);
 *                     _bf16: the same into a bf16 cache
 *
 * Rows are split across OpenMP threads when there are enough of them to pay for the fork.
 */
#include <math.h>
#include <stdint.h>

#include "cpu_math.h"

#define PAR_ROWS 16

int pg_rms_norm(const float *x, const float *w, float *out, int T, int H, float eps, int nthreads) {
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(T >= PAR_ROWS)")
    for (int t = 0; t < T; t++) {
        const float *r = x + (int64_t)t * H;
        float ss = 0.f;
        _Pragma("omp simd reduction(+:ss)")
        for (int i = 0; i < H; i++) ss += r[i] * r[i];
        const float inv = 1.f / sqrtf(ss / H + eps);
        float *o = out + (int64_t)t * H;
        _Pragma("omp simd")
        for (int i = 0; i < H; i++) o[i] = r[i] * inv * w[i];
    }
    return 0;
}

int pg_add_rms_norm(const float *x, float *residual, const float *w, float *out, int T, int H, float eps,
                    int nthreads) {
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(T >= PAR_ROWS)")
    for (int t = 0; t < T; t++) {
        const float *a = x + (int64_t)t * H;
        float *r = residual + (int64_t)t * H;
        float ss = 0.f;
        _Pragma("omp simd reduction(+:ss)")
        for (int i = 0; i < H; i++) {
            r[i] += a[i];
            ss += r[i] * r[i];
        }
        const float inv = 1.f / sqrtf(ss / H + eps);
        float *o = out + (int64_t)t * H;
        _Pragma("omp simd")
        for (int i = 0; i < H; i++) o[i] = r[i] * inv * w[i];
    }
    return 0;
}

int pg_silu_mul(const float *gu, float *out, int T, int I, int nthreads) {
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(T >= PAR_ROWS)")
    for (int t = 0; t < T; t++) {
        const float *g = gu + (int64_t)t * 2 * I, *u = g + I;
        float *o = out + (int64_t)t * I;
        _Pragma("omp simd")
        for (int i = 0; i < I; i++) o[i] = g[i] / (1.f + pg_exp(-g[i])) * u[i];
    }
    return 0;
}

/* fp32 -> bf16, round to nearest even (inputs are finite activations). */
static inline uint16_t to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}
#define STORE_F32(x) (x)
#define STORE_BF16(x) to_bf16(x)

/* qkv: [T, (Hq + 2 Hkv) * D] rows (stride qkv_stride); cos/sin: [max_pos, D] tables;
 * caches: [num_blocks * block_size, Hkv, D] seen flat by slot, fp32 or bf16. */
#define DEFINE_ROPE_CACHE(NAME, T, STORE)                                                        \
int NAME(const float *qkv, int64_t qkv_stride, const int64_t *positions, const float *cos_t,     \
         const float *sin_t, float *q_out, T *k_cache, T *v_cache, const int64_t *slots,         \
         int T_, int Hq, int Hkv, int D, int nthreads) {                                         \
    const int half = D / 2;                                                                      \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(T_ >= PAR_ROWS)")        \
    for (int t = 0; t < T_; t++) {                                                               \
        const float *row = qkv + (int64_t)t * qkv_stride;                                        \
        const float *c = cos_t + positions[t] * D, *s = sin_t + positions[t] * D;                \
        for (int h = 0; h < Hq; h++) {                                                           \
            const float *x = row + h * D;                                                        \
            float *o = q_out + ((int64_t)t * Hq + h) * D;                                        \
            _Pragma("omp simd")                                                                  \
            for (int i = 0; i < half; i++) {                                                     \
                o[i] = x[i] * c[i] - x[i + half] * s[i];                                         \
                o[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];                    \
            }                                                                                    \
        }                                                                                        \
        const int64_t slot = slots[t];                                                           \
        if (slot < 0) continue;                                                                  \
        for (int h = 0; h < Hkv; h++) {                                                          \
            const float *x = row + (int64_t)(Hq + h) * D, *v = row + (int64_t)(Hq + Hkv + h) * D; \
            T *ko = k_cache + (slot * Hkv + h) * D, *vo = v_cache + (slot * Hkv + h) * D;        \
            for (int i = 0; i < half; i++) {                                                     \
                ko[i] = STORE(x[i] * c[i] - x[i + half] * s[i]);                                 \
                ko[i + half] = STORE(x[i + half] * c[i + half] + x[i] * s[i + half]);            \
            }                                                                                    \
            for (int i = 0; i < D; i++) vo[i] = STORE(v[i]);                                     \
        }                                                                                        \
    }                                                                                            \
    return 0;                                                                                    \
}

DEFINE_ROPE_CACHE(pg_rope_cache, float, STORE_F32)
DEFINE_ROPE_CACHE(pg_rope_cache_bf16, uint16_t, STORE_BF16)
