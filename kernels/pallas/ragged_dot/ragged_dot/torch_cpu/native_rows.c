/* The native rows kernel (native_rows.py says why and how it is built): out = x @ w^T for a few rows of x against
   a plain [N, K] weight, bfloat16 or float32, AVX512 and AVX2 builds in one file (each function carries its own
   target attribute; native_rows.choose_isa picks the build at run time). */
#include "native_loops.h"
#include <string.h>

/* The symbols native_rows.py binds (their ctypes argument types are in its _library): one product, and many experts
   in one call, per dtype, for the AVX512 build and the AVX2 one (suffix _avx2). */
#define KH_ROWS_DECL(NAME, T) void NAME(const T *x0, const T *w, T *out0, int M, int N, int K);
#define KH_GROUPED_DECL(NAME, T)                                                                                     \
    void NAME(const T *x, const T *w, T *out, const int64_t *items, int n, int N, int K, int *next);
KH_ROWS_DECL(kh_rows_bf16, uint16_t)
KH_ROWS_DECL(kh_rows_f32, float)
KH_ROWS_DECL(kh_rows_bf16_avx2, uint16_t)
KH_ROWS_DECL(kh_rows_f32_avx2, float)
KH_GROUPED_DECL(kh_grouped_bf16, uint16_t)
KH_GROUPED_DECL(kh_grouped_f32, float)
KH_GROUPED_DECL(kh_grouped_bf16_avx2, uint16_t)
KH_GROUPED_DECL(kh_grouped_f32_avx2, float)

/* out[m, n] = sum_k x[m, k] * w[n, k] for x [M, K], w [N, K] (rows contiguous), out [M, N]; float32 accumulation. */


#define BF16_BLOCK(MM, RR)                                                                                           \
    {                                                                                                                \
        __m512 acc[MM][RR];                                                                                          \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++) acc[m][r] = _mm512_setzero_ps();                                            \
        int k = 0;                                                                                                   \
        for (; k + 32 <= K; k += 32) {                                                                               \
            __m512bh wv[RR];                                                                                         \
            for (int r = 0; r < RR; r++) {                                                                           \
                _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * (size_t)K + k), _MM_HINT_T1);             \
                wv[r] = (__m512bh)_mm512_loadu_si512(wr + (size_t)r * (size_t)K + k);                                \
            }                                                                                                        \
            for (int m = 0; m < MM; m++) {                                                                           \
                __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (size_t)m * (size_t)K + k);                           \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);                     \
            }                                                                                                        \
        }                                                                                                            \
        if (k < K) {                                                                                                 \
            __mmask32 tail = (__mmask32)((1ull << (K - k)) - 1);                                                     \
            __m512bh wv[RR];                                                                                         \
            for (int r = 0; r < RR; r++)                                                                             \
                wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(tail, wr + (size_t)r * (size_t)K + k);                    \
            for (int m = 0; m < MM; m++) {                                                                           \
                __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(tail, x + (size_t)m * (size_t)K + k);               \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);                     \
            }                                                                                                        \
        }                                                                                                            \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++)                                                                             \
                out[(size_t)m * (size_t)N + (size_t)n0 + (size_t)r] = to_bf16(_mm512_reduce_add_ps(acc[m][r]));      \
    }

#define F32_BLOCK(MM, RR)                                                                                            \
    {                                                                                                                \
        __m512 acc[MM][RR];                                                                                          \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++) acc[m][r] = _mm512_setzero_ps();                                            \
        int k = 0;                                                                                                   \
        for (; k + 16 <= K; k += 16) {                                                                               \
            __m512 wv[RR];                                                                                           \
            for (int r = 0; r < RR; r++) {                                                                           \
                _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * (size_t)K + k), _MM_HINT_T1);             \
                wv[r] = _mm512_loadu_ps(wr + (size_t)r * (size_t)K + k);                                             \
            }                                                                                                        \
            for (int m = 0; m < MM; m++) {                                                                           \
                __m512 xv = _mm512_loadu_ps(x + (size_t)m * (size_t)K + k);                                          \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);                      \
            }                                                                                                        \
        }                                                                                                            \
        if (k < K) {                                                                                                 \
            __mmask16 tail = (__mmask16)((1u << (K - k)) - 1);                                                       \
            __m512 wv[RR];                                                                                           \
            for (int r = 0; r < RR; r++) wv[r] = _mm512_maskz_loadu_ps(tail, wr + (size_t)r * (size_t)K + k);        \
            for (int m = 0; m < MM; m++) {                                                                           \
                __m512 xv = _mm512_maskz_loadu_ps(tail, x + (size_t)m * (size_t)K + k);                              \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);                      \
            }                                                                                                        \
        }                                                                                                            \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++)                                                                             \
                out[(size_t)m * (size_t)N + (size_t)n0 + (size_t)r] = _mm512_reduce_add_ps(acc[m][r]);               \
    }

#define ROWS(BLOCK, RR)                                                                                              \
    switch (mm) {                                                                                                    \
    case 1: BLOCK(1, RR) break;                                                                                      \
    case 2: BLOCK(2, RR) break;                                                                                      \
    case 3: BLOCK(3, RR) break;                                                                                      \
    default: BLOCK(4, RR)                                                                                            \
    }

#define BF16_ROWS(RR) ROWS(BF16_BLOCK, RR)
#define F32_ROWS(RR) ROWS(F32_BLOCK, RR)

#define GEMV(NAME, T, BLOCKS, TARGET)                                                                                \
    __attribute__((target(TARGET))) void NAME(const T *x0, const T *w, T *out0, int M, int N, int K) {               \
        FOR_ROW_BLOCKS(T, T, T, , BLOCKS)                                                                            \
    }

GEMV(kh_rows_bf16, uint16_t, BF16_ROWS, "avx512f,avx512bw,avx512vl,avx512bf16,fma")
GEMV(kh_rows_f32, float, F32_ROWS, "avx512f,fma")

/* AVX2 + FMA (no AVX512): blocks of up to 2 rows of x against RR weight rows, 8 float lanes. bfloat16 pairs are split
   into their even and odd halves (a shift and a mask make each a float32), so each 32-byte load feeds two FMAs with no
   conversion instruction; every product is exact in float32 and the sums run in float32, the K tail (under 16 / 8)
   in scalar float32 after the vector part. */
#define T2 __attribute__((target("avx2,fma")))
#define BF16_EVEN(v) _mm256_castsi256_ps(_mm256_slli_epi32((v), 16))
#define BF16_ODD(v) _mm256_castsi256_ps(_mm256_and_si256((v), _mm256_set1_epi32((int)0xffff0000u)))

#define BF16_BLOCK2(MM, RR)                                                                                          \
    {                                                                                                                \
        __m256 acc[MM][RR];                                                                                          \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++) acc[m][r] = _mm256_setzero_ps();                                            \
        int k = 0;                                                                                                   \
        for (; k + 16 <= K; k += 16) {                                                                               \
            __m256 xe[MM], xo[MM];                                                                                   \
            for (int m = 0; m < MM; m++) {                                                                           \
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (size_t)m * (size_t)K + k));                   \
                xe[m] = BF16_EVEN(xv);                                                                               \
                xo[m] = BF16_ODD(xv);                                                                                \
            }                                                                                                        \
            for (int r = 0; r < RR; r++) {                                                                           \
                _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * (size_t)K + k), _MM_HINT_T1);             \
                __m256i wv = _mm256_loadu_si256((const __m256i *)(wr + (size_t)r * (size_t)K + k));                  \
                __m256 we = BF16_EVEN(wv), wo = BF16_ODD(wv);                                                        \
                for (int m = 0; m < MM; m++)                                                                         \
                    acc[m][r] = _mm256_fmadd_ps(xo[m], wo, _mm256_fmadd_ps(xe[m], we, acc[m][r]));                   \
            }                                                                                                        \
        }                                                                                                            \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++) {                                                                           \
                float t = kh_hsum8(acc[m][r]);                                                                       \
                for (int kk = k; kk < K; kk++)                                                                       \
                    t += kh_bf16_f32(x[(size_t)m * (size_t)K + (size_t)kk]) *                                        \
                         kh_bf16_f32(wr[(size_t)r * (size_t)K + (size_t)kk]);                                        \
                out[(size_t)m * (size_t)N + (size_t)n0 + (size_t)r] = to_bf16(t);                                    \
            }                                                                                                        \
    }

#define F32_BLOCK2(MM, RR)                                                                                           \
    {                                                                                                                \
        __m256 acc[MM][RR];                                                                                          \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++) acc[m][r] = _mm256_setzero_ps();                                            \
        int k = 0;                                                                                                   \
        for (; k + 8 <= K; k += 8) {                                                                                 \
            __m256 xv[MM];                                                                                           \
            for (int m = 0; m < MM; m++) xv[m] = _mm256_loadu_ps(x + (size_t)m * (size_t)K + k);                     \
            for (int r = 0; r < RR; r++) {                                                                           \
                _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * (size_t)K + k), _MM_HINT_T1);             \
                __m256 wv = _mm256_loadu_ps(wr + (size_t)r * (size_t)K + k);                                         \
                for (int m = 0; m < MM; m++) acc[m][r] = _mm256_fmadd_ps(xv[m], wv, acc[m][r]);                      \
            }                                                                                                        \
        }                                                                                                            \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++) {                                                                           \
                float t = kh_hsum8(acc[m][r]);                                                                       \
                for (int kk = k; kk < K; kk++)                                                                       \
                    t += x[(size_t)m * (size_t)K + (size_t)kk] * wr[(size_t)r * (size_t)K + (size_t)kk];             \
                out[(size_t)m * (size_t)N + (size_t)n0 + (size_t)r] = t;                                             \
            }                                                                                                        \
    }

#define ROWS2(BLOCK, RR)                                                                                             \
    switch (mm) {                                                                                                    \
    case 1: BLOCK(1, RR) break;                                                                                      \
    default: BLOCK(2, RR)                                                                                            \
    }

#define BF16_ROWS2(RR) ROWS2(BF16_BLOCK2, RR)
#define F32_ROWS2(RR) ROWS2(F32_BLOCK2, RR)

T2 void kh_rows_bf16_avx2(const uint16_t *x0, const uint16_t *w, uint16_t *out0, int M, int N, int K) {
    FOR_ROW_BLOCKS_M(uint16_t, uint16_t, uint16_t, , BF16_ROWS2, 2)
}
T2 void kh_rows_f32_avx2(const float *x0, const float *w, float *out0, int M, int N, int K) {
    FOR_ROW_BLOCKS_M(float, float, float, , F32_ROWS2, 2)
}

/* Many experts in one call (FOR_ITEMS): rows of x and out are in expert order, w is a contiguous [E, N, K] stack.
   Each output is summed exactly as a single call would sum it. */
#define GROUPED(NAME, SINGLE, T, TARGET)                                                                             \
    __attribute__((target(TARGET))) void NAME(const T *x, const T *w, T *out, const int64_t *items, int n,           \
                                              int N, int K, int *next) {                                             \
        FOR_ITEMS(SINGLE(x + it[1] * K, w + it[0] * (int64_t)N * K, out + it[1] * N, (int)it[2], N, K))              \
    }

GROUPED(kh_grouped_bf16, kh_rows_bf16, uint16_t, "avx512f,avx512bw,avx512vl,avx512bf16,fma")
GROUPED(kh_grouped_f32, kh_rows_f32, float, "avx512f,fma")
GROUPED(kh_grouped_bf16_avx2, kh_rows_bf16_avx2, uint16_t, "avx2,fma")
GROUPED(kh_grouped_f32_avx2, kh_rows_f32_avx2, float, "avx2,fma")
