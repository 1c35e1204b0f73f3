/* The native quantized kernel (native_quant.py says why and how it is built): out = x @ dequant(w)^T for a few rows
   of x against int8 (per-channel scales) or float8_e4m3fn (128 x 128 block scales) [N, K] weights, plus the int16-lhs
   route for int8 x bfloat16; AVX512 and AVX2 builds in one file (each function carries its own target attribute).
   XBITS, the int16 lhs rows' bits of magnitude, comes from native_quant.XBITS (-DXBITS=...). */
#include "native_loops.h"

#ifndef XBITS
#error "XBITS is not defined: build with -DXBITS=<bits> (native_quant.XBITS)"
#endif

/* The symbols native_quant.py binds (their ctypes argument types are in its _library), for the AVX512 build and the
   AVX2 one (suffix _avx2): one product and many experts in one call per weight format, the int16-lhs route's (float32
   or bfloat16 output, suffix _bf16) and the int16 rows it reads. */
#define KH_Q_DECLS(SUFFIX)                                                                                           \
    void kh_q_rows_i8##SUFFIX(const float *x0, const int8_t *w, const float *s, float *out0, int M, int N, int K,    \
                              int sk, int sn);                                                                       \
    void kh_q_rows_f8##SUFFIX(const float *x0, const int8_t *w, const float *s, float *out0, int M, int N, int K,    \
                              int sk, int sn);                                                                       \
    void kh_q_grouped_i8##SUFFIX(const float *x, const int8_t *w, const float *s, float *out, const int64_t *items,  \
                                 int n, int N, int K, int sk, int sn, int64_t sstride, int *next);                   \
    void kh_q_grouped_f8##SUFFIX(const float *x, const int8_t *w, const float *s, float *out, const int64_t *items,  \
                                 int n, int N, int K, int sk, int sn, int64_t sstride, int *next);                   \
    int kh_x16_rows##SUFFIX(const uint16_t *x, const int64_t *idx, int16_t *q, float *xs, int M, int K);             \
    KH_X16_DECLS(SUFFIX, float)                                                                                      \
    KH_X16_DECLS(SUFFIX##_bf16, uint16_t)
#define KH_X16_DECLS(SUFFIX, OT)                                                                                     \
    void kh_q_rows_i8_x16##SUFFIX(const int16_t *x0, const float *xs0, const int8_t *w, const float *s, OT *out0,    \
                                  int M, int N, int K, int sk, int sn);                                              \
    void kh_q_grouped_i8_x16##SUFFIX(const int16_t *x, const float *xs, const int8_t *w, const float *s, OT *out,    \
                                     const int64_t *items, int n, int N, int K, int sk, int sn, int64_t sstride,     \
                                     int *next);
KH_Q_DECLS()
KH_Q_DECLS(_avx2)
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define BLK 128

/* 16 int8 weights -> float32 (exact). */
TGT static inline __m512 dec_i8(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }

/* 16 float8_e4m3fn bytes -> float32 (exact): normals by moving exponent and mantissa into place and rebiasing
   (7 - 127), subnormals (exponent 0) as m * 2^-9, 0x7f / 0xff as NaN, the sign bit on top. */
TGT static inline __m512 dec_f8(__m128i b) {
    __m512i v = _mm512_cvtepu8_epi32(b);
    __m512i em = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
    __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(em, 20), _mm512_set1_epi32(120 << 23));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(1.0f / 512.0f));
    __mmask16 is_sub = _mm512_cmplt_epi32_mask(em, _mm512_set1_epi32(8));
    __mmask16 is_nan = _mm512_cmpeq_epi32_mask(em, _mm512_set1_epi32(0x7f));
    __m512i mag = _mm512_mask_mov_epi32(normal, is_sub, _mm512_castps_si512(sub));
    mag = _mm512_mask_mov_epi32(mag, is_nan, _mm512_set1_epi32(0x7fc00000));
    return _mm512_castsi512_ps(_mm512_or_si512(mag, sign));
}

/* One block of MM rows of x against RR weight rows over K, in slices of `span` (K for int8: one slice; BLK for
   float8). After each slice every (row, weight row) sum is reduced and, for float8, multiplied by its block scale. */
#define QBLOCK(DEC, MM, RR)                                                                                          \
    {                                                                                                                \
        float tot[MM][RR];                                                                                           \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++) tot[m][r] = 0.0f;                                                           \
        for (int k0 = 0; k0 < K; k0 += span) {                                                                       \
            int k1 = k0 + span < K ? k0 + span : K;                                                                  \
            __m512 acc[MM][RR];                                                                                      \
            for (int m = 0; m < MM; m++)                                                                             \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_setzero_ps();                                        \
            int k = k0;                                                                                              \
            for (; k + 16 <= k1; k += 16) {                                                                          \
                __m512 wv[RR];                                                                                       \
                for (int r = 0; r < RR; r++) {                                                                       \
                    _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * (size_t)K + k), _MM_HINT_T1);         \
                    wv[r] = DEC(_mm_loadu_si128((const __m128i *)(wr + (size_t)r * (size_t)K + k)));                 \
                }                                                                                                    \
                for (int m = 0; m < MM; m++) {                                                                       \
                    __m512 xv = _mm512_loadu_ps(x + (size_t)m * (size_t)K + k);                                      \
                    for (int r = 0; r < RR; r++) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);                  \
                }                                                                                                    \
            }                                                                                                        \
            if (k < k1) {                                                                                            \
                __mmask16 tail = (__mmask16)((1u << (k1 - k)) - 1);                                                  \
                __m512 wv[RR];                                                                                       \
                for (int r = 0; r < RR; r++)                                                                         \
                    wv[r] = _mm512_maskz_mov_ps(tail,                                                                \
                        DEC(_mm_maskz_loadu_epi8(tail, wr + (size_t)r * (size_t)K + k)));                            \
                for (int m = 0; m < MM; m++) {                                                                       \
                    __m512 xv = _mm512_maskz_loadu_ps(tail, x + (size_t)m * (size_t)K + k);                          \
                    for (int r = 0; r < RR; r++) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);                  \
                }                                                                                                    \
            }                                                                                                        \
            for (int m = 0; m < MM; m++)                                                                             \
                for (int r = 0; r < RR; r++) {                                                                       \
                    float part = _mm512_reduce_add_ps(acc[m][r]);                                                    \
                    tot[m][r] += blocks ? part * s[(size_t)(k0 / BLK) * (size_t)sk +                                 \
                                                  (size_t)((n0 + r) / BLK) * (size_t)sn] : part;                     \
                }                                                                                                    \
        }                                                                                                            \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++)                                                                             \
                out[(size_t)m * (size_t)N + (size_t)n0 + (size_t)r] =                                                \
                    blocks ? tot[m][r] : tot[m][r] * s[(size_t)(n0 + r) * (size_t)sn];                               \
    }

#define QROWS(DEC, RR)                                                                                               \
    switch (mm) {                                                                                                    \
    case 1: QBLOCK(DEC, 1, RR) break;                                                                                \
    case 2: QBLOCK(DEC, 2, RR) break;                                                                                \
    case 3: QBLOCK(DEC, 3, RR) break;                                                                                \
    default: QBLOCK(DEC, 4, RR)                                                                                      \
    }

#define I8_ROWS(RR) QROWS(dec_i8, RR)
#define F8_ROWS(RR) QROWS(dec_f8, RR)

/* out[M, N] (float32) = x[M, K] (float32) against w[N, K] (int8 or float8 bytes) with scales s; see the module. */
#define QGEMV(NAME, ROWS, BLOCKS)                                                                                    \
    TGT void NAME(const float *x0, const int8_t *w, const float *s, float *out0, int M, int N, int K, int sk,        \
                  int sn) {                                                                                          \
        const int blocks = BLOCKS;                                                                                   \
        const int span = BLOCKS ? BLK : K;                                                                           \
        FOR_ROW_BLOCKS(int8_t, float, float, , ROWS)                                                                 \
    }

QGEMV(kh_q_rows_i8, I8_ROWS, 0)
QGEMV(kh_q_rows_f8, F8_ROWS, 1)

/* Many experts in one call (FOR_ITEMS): w is a contiguous [E, N, K] byte stack, s a contiguous per-expert scale
   stack of `sstride` floats each. */
#define QGROUPED(NAME, SINGLE)                                                                                       \
    TGT void NAME(const float *x, const int8_t *w, const float *s, float *out, const int64_t *items, int n,          \
                  int N, int K, int sk, int sn, int64_t sstride, int *next) {                                        \
        FOR_ITEMS(SINGLE(x + it[1] * K, w + it[0] * (int64_t)N * K, s + it[0] * sstride, out + it[1] * N,            \
                         (int)it[2], N, K, sk, sn))                                                                  \
    }

QGROUPED(kh_q_grouped_i8, kh_q_rows_i8)
QGROUPED(kh_q_grouped_f8, kh_q_rows_f8)

/* int8 weights against a bfloat16 lhs given as int16 rows with one float scale each (x[m, k] ~ xq[m, k] * xs[m],
   XBITS bits: see x16_rows in Python): VPDPWSSD multiplies 32 int16 pairs into int32 sums exactly, one instruction
   per 32 weights and row, with one widening (VPMOVSXBW) per 32 weights. The int32 sums are flushed to float every
   I16_SPAN of K, before they could overflow (I16_SPAN * 2^XBITS * 127 < 2^31). */
/* One output of the int16-lhs route, stored as its pointer's type: float32, or bfloat16 bits (to_bf16). */
static inline void kh_put_f32(float *p, double v) { *p = (float)v; }
static inline void kh_put_bf16(uint16_t *p, double v) { *p = to_bf16((float)v); }
#define KH_PUT(p, v) _Generic((p), float *: kh_put_f32, uint16_t *: kh_put_bf16)(p, v)
#define TGTV __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))
#define I16_SPAN 1024

#define VBLOCK(MM, RR)                                                                                               \
    {                                                                                                                \
        double tot[MM][RR];                                                                                          \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++) tot[m][r] = 0.0;                                                            \
        for (int k0 = 0; k0 < K; k0 += I16_SPAN) {                                                                   \
            int k1 = k0 + I16_SPAN < K ? k0 + I16_SPAN : K;                                                          \
            __m512i acc[MM][RR];                                                                                     \
            for (int m = 0; m < MM; m++)                                                                             \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_setzero_si512();                                     \
            int k = k0;                                                                                              \
            for (; k + 32 <= k1; k += 32) {                                                                          \
                __m512i wv[RR];                                                                                      \
                for (int r = 0; r < RR; r++) {                                                                       \
                    _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * (size_t)K + k), _MM_HINT_T1);         \
                    wv[r] = _mm512_cvtepi8_epi16(                                                                    \
                        _mm256_loadu_si256((const __m256i *)(wr + (size_t)r * (size_t)K + k)));                      \
                }                                                                                                    \
                for (int m = 0; m < MM; m++) {                                                                       \
                    __m512i xv = _mm512_loadu_si512(x + (size_t)m * (size_t)K + k);                                  \
                    for (int r = 0; r < RR; r++) acc[m][r] = _mm512_dpwssd_epi32(acc[m][r], xv, wv[r]);              \
                }                                                                                                    \
            }                                                                                                        \
            if (k < k1) {                                                                                            \
                __mmask32 tail = (__mmask32)((1ull << (k1 - k)) - 1);                                                \
                __m512i wv[RR];                                                                                      \
                for (int r = 0; r < RR; r++)                                                                         \
                    wv[r] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(tail, wr + (size_t)r * (size_t)K + k));     \
                for (int m = 0; m < MM; m++) {                                                                       \
                    __m512i xv = _mm512_maskz_loadu_epi16(tail, x + (size_t)m * (size_t)K + k);                      \
                    for (int r = 0; r < RR; r++) acc[m][r] = _mm512_dpwssd_epi32(acc[m][r], xv, wv[r]);              \
                }                                                                                                    \
            }                                                                                                        \
            for (int m = 0; m < MM; m++)                                                                             \
                for (int r = 0; r < RR; r++) tot[m][r] += (double)_mm512_reduce_add_epi32(acc[m][r]);                \
        }                                                                                                            \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++)                                                                             \
                KH_PUT(out + (size_t)m * (size_t)N + n0 + r,                                                         \
                       tot[m][r] * (double)xs[m] * (double)s[(size_t)(n0 + r) * (size_t)sn]);                        \
    }

#define VROWS(RR)                                                                                                    \
    switch (mm) {                                                                                                    \
    case 1: VBLOCK(1, RR) break;                                                                                     \
    case 2: VBLOCK(2, RR) break;                                                                                     \
    case 3: VBLOCK(3, RR) break;                                                                                     \
    default: VBLOCK(4, RR)                                                                                           \
    }

/* The int16-lhs route's functions for one build (TARGET, row blocks BLOCKS of at most MB rows of x), writing float32
   (SUFFIX) or bfloat16 (SUFFIX_bf16: rounded once from the float64 total's float32, as torch rounds the float32
   output, so both outputs agree bit for bit): the rows kernel and its many-experts form. */
#define X16_FUNCS(TARGET, SUFFIX, BLOCKS, MB)                                                                        \
    X16_FUNC(TARGET, SUFFIX, float, BLOCKS, MB)                                                                      \
    X16_FUNC(TARGET, SUFFIX##_bf16, uint16_t, BLOCKS, MB)
#define X16_FUNC(TARGET, SUFFIX, OT, BLOCKS, MB)                                                                     \
    TARGET void kh_q_rows_i8_x16##SUFFIX(const int16_t *x0, const float *xs0, const int8_t *w, const float *s,       \
                                         OT *out0, int M, int N, int K, int sk, int sn) {                            \
        (void)sk;                                                                                                    \
        FOR_ROW_BLOCKS_M(int8_t, int16_t, OT, const float *xs = xs0 + m0;, BLOCKS, MB)                               \
    }                                                                                                                \
    TARGET void kh_q_grouped_i8_x16##SUFFIX(const int16_t *x, const float *xs, const int8_t *w, const float *s,      \
                                            OT *out, const int64_t *items, int n, int N, int K, int sk,              \
                                            int sn, int64_t sstride, int *next) {                                    \
        FOR_ITEMS(kh_q_rows_i8_x16##SUFFIX(x + it[1] * K, xs + it[1], w + it[0] * (int64_t)N * K,                    \
                                           s + it[0] * sstride, out + it[1] * N, (int)it[2], N, K, sk, sn));         \
    }

X16_FUNCS(TGTV, , VROWS, 4)

/* bfloat16 rows [M, K] -> int16 rows q and float scales xs, as the int16-lhs route reads them (XBITS bits): per row
   amax = max |x| (in bfloat16: the largest of the magnitudes' bit patterns), xs = amax / (2^XBITS - 1) (1 for a zero
   row), q = round-half-even(x * (1 / xs)), all in float32: the steps and roundings of a torch reference, in one
   pass over the rows instead of five whole-tensor ops. Row m is x's row idx[m] (idx NULL: row m), so a gather of the
   routed rows costs no extra pass. Returns the number of rows holding NaN or Inf (their q and xs are not written);
   those leave the route. */
#define XMAX ((float)((1 << XBITS) - 1))
static inline float kh_x16_scale(uint16_t amax_bits) {
    float amax = kh_bf16_f32(amax_bits);
    return amax > 0.0f ? amax / XMAX : 1.0f;
}
/* A row's largest magnitude bits: the n vector lanes' maxima (over row[0, k)), then the scalar tail row[k, K). */
static inline uint16_t kh_amax_bits(const uint16_t *lanes, int n, const uint16_t *row, int k, int K) {
    uint16_t amax = 0;
    for (int i = 0; i < n; i++) amax = lanes[i] > amax ? lanes[i] : amax;
    for (; k < K; k++) { uint16_t a = row[k] & 0x7fff; amax = a > amax ? a : amax; }
    return amax;
}
TGT int kh_x16_rows(const uint16_t *x, const int64_t *idx, int16_t *q, float *xs, int M, int K) {
    int bad = 0;
    for (int m = 0; m < M; m++) {
        const uint16_t *row = x + (size_t)(idx ? idx[m] : m) * (size_t)K;
        int16_t *out = q + (size_t)m * (size_t)K;
        __m512i mx = _mm512_setzero_si512();
        int k = 0;
        for (; k + 32 <= K; k += 32)
            mx = _mm512_max_epu16(mx, _mm512_and_si512(_mm512_loadu_si512(row + k), _mm512_set1_epi16(0x7fff)));
        uint16_t lanes[32];
        _mm512_storeu_si512(lanes, mx);
        uint16_t amax = kh_amax_bits(lanes, 32, row, k, K);
        if (amax >= 0x7f80) { bad++; continue; }
        float scale = kh_x16_scale(amax);
        __m512 inv = _mm512_set1_ps(1.0f / scale);
        for (k = 0; k < K; k += 16) {
            __mmask16 live = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
            __m512i b = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, row + k));
            __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), inv);
            _mm256_mask_storeu_epi16(out + k, live, _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(f)));
        }
        xs[m] = scale;
    }
    return bad;
}

/* ---- AVX2 + FMA builds (CPUs without AVX512): 8 float lanes, blocks of up to 2 rows of x (16 vector registers),
   the K tail of each slice in scalar float32 after the vector part. Same formats and sums per slice as above. ---- */
#define T2Q __attribute__((target("avx2,fma")))

/* 8 int8 weights -> float32 (exact). */
T2Q static inline __m256 dec_i8_2(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
/* 8 float8_e4m3fn bytes -> float32 (exact), as dec_f8. */
T2Q static inline __m256 dec_f8_2(const int8_t *p) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i em = _mm256_and_si256(v, _mm256_set1_epi32(0x7f));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
    __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23)));
    __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(1.0f / 512.0f));
    __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), em));
    __m256 is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f)));
    __m256 mag = _mm256_blendv_ps(normal, sub, is_sub);
    mag = _mm256_blendv_ps(mag, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), is_nan);
    return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}
/* One weight byte -> float32 (the scalar tails). */
static inline float dec_i8_1(int8_t b) { return (float)b; }
static inline float dec_f8_1(int8_t byte) {
    uint32_t v = (uint8_t)byte, em = v & 0x7f, bits;
    if (em == 0x7f) bits = 0x7fc00000u;
    else if (em < 8) { float f = (float)em / 512.0f; __builtin_memcpy(&bits, &f, 4); }
    else bits = (em << 20) + (120u << 23);
    bits |= (v & 0x80u) << 24;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

#define QBLOCK2(DEC, DEC1, MM, RR)                                                                                   \
    {                                                                                                                \
        float tot[MM][RR];                                                                                           \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++) tot[m][r] = 0.0f;                                                           \
        for (int k0 = 0; k0 < K; k0 += span) {                                                                       \
            int k1 = k0 + span < K ? k0 + span : K;                                                                  \
            __m256 acc[MM][RR];                                                                                      \
            for (int m = 0; m < MM; m++)                                                                             \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm256_setzero_ps();                                        \
            int k = k0;                                                                                              \
            for (; k + 8 <= k1; k += 8) {                                                                            \
                __m256 xv[MM];                                                                                       \
                for (int m = 0; m < MM; m++) xv[m] = _mm256_loadu_ps(x + (size_t)m * (size_t)K + k);                 \
                for (int r = 0; r < RR; r++) {                                                                       \
                    _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * (size_t)K + k), _MM_HINT_T1);         \
                    __m256 wv = DEC(wr + (size_t)r * (size_t)K + k);                                                 \
                    for (int m = 0; m < MM; m++) acc[m][r] = _mm256_fmadd_ps(xv[m], wv, acc[m][r]);                  \
                }                                                                                                    \
            }                                                                                                        \
            for (int m = 0; m < MM; m++)                                                                             \
                for (int r = 0; r < RR; r++) {                                                                       \
                    float part = kh_hsum8(acc[m][r]);                                                                \
                    for (int kk = k; kk < k1; kk++)                                                                  \
                        part += x[(size_t)m * (size_t)K + (size_t)kk] * DEC1(wr[(size_t)r * (size_t)K + (size_t)kk]); \
                    tot[m][r] += blocks ? part * s[(size_t)(k0 / BLK) * (size_t)sk +                                 \
                                                  (size_t)((n0 + r) / BLK) * (size_t)sn] : part;                     \
                }                                                                                                    \
        }                                                                                                            \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR; r++)                                                                             \
                out[(size_t)m * (size_t)N + (size_t)n0 + (size_t)r] =                                                \
                    blocks ? tot[m][r] : tot[m][r] * s[(size_t)(n0 + r) * (size_t)sn];                               \
    }

#define QROWS2(DEC, DEC1, RR)                                                                                        \
    switch (mm) {                                                                                                    \
    case 1: QBLOCK2(DEC, DEC1, 1, RR) break;                                                                         \
    default: QBLOCK2(DEC, DEC1, 2, RR)                                                                               \
    }

#define I8_ROWS2(RR) QROWS2(dec_i8_2, dec_i8_1, RR)
#define F8_ROWS2(RR) QROWS2(dec_f8_2, dec_f8_1, RR)

#define QGEMV2(NAME, ROWS, BLOCKS)                                                                                   \
    T2Q void NAME(const float *x0, const int8_t *w, const float *s, float *out0, int M, int N, int K, int sk,        \
                  int sn) {                                                                                          \
        const int blocks = BLOCKS;                                                                                   \
        const int span = BLOCKS ? BLK : K;                                                                           \
        FOR_ROW_BLOCKS_M(int8_t, float, float, , ROWS, 2)                                                            \
    }

QGEMV2(kh_q_rows_i8_avx2, I8_ROWS2, 0)
QGEMV2(kh_q_rows_f8_avx2, F8_ROWS2, 1)
QGROUPED(kh_q_grouped_i8_avx2, kh_q_rows_i8_avx2)
QGROUPED(kh_q_grouped_f8_avx2, kh_q_rows_f8_avx2)

/* kh_x16_rows on AVX2: the same steps, 8 lanes (VCVTPS2DQ rounds half to even, as torch.round). */
T2Q int kh_x16_rows_avx2(const uint16_t *x, const int64_t *idx, int16_t *q, float *xs, int M, int K) {
    int bad = 0;
    for (int m = 0; m < M; m++) {
        const uint16_t *row = x + (size_t)(idx ? idx[m] : m) * (size_t)K;
        int16_t *out = q + (size_t)m * (size_t)K;
        __m256i mx = _mm256_setzero_si256();
        int k = 0;
        for (; k + 16 <= K; k += 16)
            mx = _mm256_max_epu16(mx, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(row + k)),
                                                       _mm256_set1_epi16(0x7fff)));
        uint16_t lanes[16];
        _mm256_storeu_si256((__m256i *)lanes, mx);
        uint16_t amax = kh_amax_bits(lanes, 16, row, k, K);
        if (amax >= 0x7f80) { bad++; continue; }
        float scale = kh_x16_scale(amax);
        float inv = 1.0f / scale;
        __m256 vinv = _mm256_set1_ps(inv);
        for (k = 0; k + 8 <= K; k += 8) {
            __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + k)));
            __m256i i = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(b, 16)), vinv));
            _mm_storeu_si128((__m128i *)(out + k),
                             _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1)));
        }
        for (; k < K; k++) out[k] = (int16_t)__builtin_nearbyintf(kh_bf16_f32(row[k]) * inv);
        xs[m] = scale;
    }
    return bad;
}

/* The int16-lhs route on AVX2 (VPMADDWD: 16 int16 pairs into 8 exact int32 sums, added to int32 accumulators), with
   the same XBITS rows, I16_SPAN flushes and float64 totals as the VNNI route. */
/* Weight rows in pairs (RR2 of them, 1 or 2) against up to 4 rows of x: 8 int32 accumulators, so each widened weight
   vector serves every row of x of the block. */
#define VBLOCK2(MM, RR2, rw)                                                                                         \
    {                                                                                                                \
        double tot[MM][RR2];                                                                                         \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR2; r++) tot[m][r] = 0.0;                                                           \
        for (int k0 = 0; k0 < K; k0 += I16_SPAN) {                                                                   \
            int k1 = k0 + I16_SPAN < K ? k0 + I16_SPAN : K;                                                          \
            __m256i acc[MM][RR2];                                                                                    \
            for (int m = 0; m < MM; m++)                                                                             \
                for (int r = 0; r < RR2; r++) acc[m][r] = _mm256_setzero_si256();                                    \
            int k = k0;                                                                                              \
            for (; k + 16 <= k1; k += 16) {                                                                          \
                __m256i wv[RR2];                                                                                     \
                for (int r = 0; r < RR2; r++) {                                                                      \
                    _mm_prefetch((const char *)(rw + (size_t)(r + AHEAD * R) * (size_t)K + k), _MM_HINT_T1);         \
                    wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rw + (size_t)r * (size_t)K + k))); \
                }                                                                                                    \
                for (int m = 0; m < MM; m++) {                                                                       \
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (size_t)m * (size_t)K + k));               \
                    for (int r = 0; r < RR2; r++)                                                                    \
                        acc[m][r] = _mm256_add_epi32(acc[m][r], _mm256_madd_epi16(xv, wv[r]));                       \
                }                                                                                                    \
            }                                                                                                        \
            for (int m = 0; m < MM; m++)                                                                             \
                for (int r = 0; r < RR2; r++) {                                                                      \
                    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc[m][r]),                                     \
                                              _mm256_extracti128_si256(acc[m][r], 1));                               \
                    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));                                                \
                    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));                                                \
                    int32_t part = _mm_cvtsi128_si32(h);                                                             \
                    for (int kk = k; kk < k1; kk++)                                                                  \
                        part += (int32_t)x[(size_t)m * (size_t)K + (size_t)kk] *                                     \
                                (int32_t)rw[(size_t)r * (size_t)K + (size_t)kk];                                     \
                    tot[m][r] += (double)part;                                                                       \
                }                                                                                                    \
        }                                                                                                            \
        for (int m = 0; m < MM; m++)                                                                                 \
            for (int r = 0; r < RR2; r++)                                                                            \
                KH_PUT(out + (size_t)m * (size_t)N + (rw - wr) / K + n0 + r,                                         \
                       tot[m][r] * (double)xs[m] * (double)s[(size_t)(n0 + (rw - wr) / K + r) * (size_t)sn]);        \
    }

/* RR weight rows (4, or 1 at the end) as pairs. */
#define VPAIRS(MM, RR)                                                                                               \
    if (RR == 1) VBLOCK2(MM, 1, wr)                                                                                  \
    else for (int p = 0; p < RR; p += 2) { const int8_t *rwp = wr + (size_t)p * (size_t)K; VBLOCK2(MM, 2, rwp) }

#define VROWS2(RR)                                                                                                   \
    switch (mm) {                                                                                                    \
    case 1: VPAIRS(1, RR) break;                                                                                     \
    case 2: VPAIRS(2, RR) break;                                                                                     \
    case 3: VPAIRS(3, RR) break;                                                                                     \
    default: VPAIRS(4, RR)                                                                                           \
    }

X16_FUNCS(T2Q, _avx2, VROWS2, 4)
