/* Small math shared by the CPU kernels. */
#pragma once
#include <stdint.h>

/* exp(v), branch-free so that loops calling it vectorize: 2^k * p(r) with v = k ln2 + r,
 * |r| <= ln2/2, p the degree-6 Taylor polynomial (relative error ~2e-7). v is clamped to
 * [-87, 88]: the result stays finite and normal (callers that need exp(-inf) = 0 handle it). */
static inline float pg_exp(float v) {
    v = v < -87.f ? -87.f : (v > 88.f ? 88.f : v);
    const float k = __builtin_roundf(v * 1.44269504088896341f);
    const float r = v - k * 0.693145751953125f - k * 1.428606765330187e-06f;
    float p = 1.f / 720.f;
    p = p * r + 1.f / 120.f;
    p = p * r + 1.f / 24.f;
    p = p * r + 1.f / 6.f;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    union { float f; int32_t i; } scale = {.i = ((int32_t)k + 127) << 23};
    return p * scale.f;
}
