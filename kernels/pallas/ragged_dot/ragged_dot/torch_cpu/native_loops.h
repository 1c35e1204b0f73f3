/* The C both native kernels share (native_rows.c and native_quant.c include it): the weight-row group and prefetch
   distance, the loop over weight-row groups and blocks of x's rows, the loop over a grouped call's items, and the
   bfloat16 / float32 conversions and the AVX2 lane sum both use. Only the kernels' own build reads it: native_rows.py
   copies it, verified, into the private build folder beside the .c file that includes it. */
#ifndef KH_NATIVE_LOOPS_H
#define KH_NATIVE_LOOPS_H
#include <immintrin.h>
#include <stdint.h>
#include <stddef.h>

/* Four weight rows at a time (R), all of x's rows against them in blocks of four before the next group, so each
   weight byte is read from memory once; the rows two groups ahead are prefetched into L2. */
#define R 4
#define AHEAD 2

/* The weight rows in groups of R, then one at a time; against each, x's rows in blocks of up to 4 (mm of them).
   SETUP runs first in each block (more per-row pointers), then BLOCKS(RR) computes out[m0 .. m0 + mm) x
   [n0 .. n0 + RR) from wr (weight row n0), x (row m0 of x0) and out (row m0 of out0). The enclosing function has
   x0, w, out0 (element types XT, WT, OT) and M, N, K. */
#define FOR_ROW_BLOCKS(WT, XT, OT, SETUP, BLOCKS) FOR_ROW_BLOCKS_M(WT, XT, OT, SETUP, BLOCKS, 4)
/* The same with blocks of up to MB rows of x (AVX2 has 16 vector registers: its blocks take 2 rows). */
#define FOR_ROW_BLOCKS_M(WT, XT, OT, SETUP, BLOCKS, MB)                                                              \
    int n0 = 0;                                                                                                      \
    for (; n0 + R <= N; n0 += R) {                                                                                   \
        const WT *wr = w + (size_t)n0 * (size_t)K;                                                                   \
        for (int m0 = 0; m0 < M; m0 += MB) {                                                                         \
            int mm = M - m0 < MB ? M - m0 : MB;                                                                      \
            const XT *x = x0 + (size_t)m0 * (size_t)K;                                                               \
            OT *out = out0 + (size_t)m0 * (size_t)N;                                                                 \
            SETUP                                                                                                    \
            BLOCKS(R)                                                                                                \
        }                                                                                                            \
    }                                                                                                                \
    for (; n0 < N; n0++) {                                                                                           \
        const WT *wr = w + (size_t)n0 * (size_t)K;                                                                   \
        for (int m0 = 0; m0 < M; m0 += MB) {                                                                         \
            int mm = M - m0 < MB ? M - m0 : MB;                                                                      \
            const XT *x = x0 + (size_t)m0 * (size_t)K;                                                               \
            OT *out = out0 + (size_t)m0 * (size_t)N;                                                                 \
            SETUP                                                                                                    \
            BLOCKS(1)                                                                                                \
        }                                                                                                            \
    }

/* AVX2: a fixed-order sum of 8 float lanes (the same tree for every output, so results do not depend on the call). */
__attribute__((target("avx2,fma"))) static inline float kh_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* bfloat16 bits -> float32 (exact). */
static inline float kh_bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

/* float32 -> bfloat16 bits, rounded to nearest even (as torch's .to(torch.bfloat16)); NaN stays NaN. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Many experts in one call: items[i] = (expert, first row, rows). Every thread that calls with the same `next`
   takes the next item (dynamic scheduling), so two workers share one layer without a return to Python per
   expert; the statement given runs one item `it`. The enclosing function has items, n and next. */
#define FOR_ITEMS(...)                                                                                               \
    for (;;) {                                                                                                       \
        int i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                                                       \
        if (i >= n) break;                                                                                           \
        const int64_t *it = items + 3 * (size_t)i;                                                                   \
        __VA_ARGS__;                                                                                                 \
    }

#endif /* KH_NATIVE_LOOPS_H */
