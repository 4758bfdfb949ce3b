// dflash-gguf: F16 / BF16 / F32 weights x F32 activations.
//
// ggml multiplies these by vec_dot for one column (4 accumulators of 8 lanes, activations rounded to
// F16 / BF16 like the weights) and by tinyBLAS from two columns on (one accumulator per output), so a row of
// a verify batch came out different in the last bits from the same token decoded alone. Here every
// output (row i, column j) is summed the same way whatever the batch width and the tile it falls in:
// lane l of one 8-float accumulator takes k = l, l + 8, ... in order (one FMA each), then a fixed
// horizontal sum, then the k % 8 tail in order. Tiles of RM rows x RN columns only decide which
// outputs share a pass over the weights (RM x RN accumulators in registers).

#include "tile_gemm.h"

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

namespace {

// Weight rows per tile (8 rows for a single column measured no faster: the weights' stream, not the
// FMA chains, bounds it); columns per pass: RM x RN accumulators + RN activation vectors + one weight
// vector fit in the 16 AVX2 / 32 AVX-512 vector registers. AVX-512 holds two rows' 8-float accumulators side
// by side in one __m512 (rows 2i, 2i + 1): each lane takes the same FMAs in the same order as in a __m256, so
// the bits are the AVX2 variant's, with half the FMA instructions (2 x RN accumulators + RN activations).
constexpr int RM = 4;
#if defined(__AVX512F__)
constexpr int RN_MAX = 8;
#else
constexpr int RN_MAX = 3;
#endif

#if defined(__AVX512F__)
// 8 16-bit weights of row a, then 8 of row b
template <typename T>
DFLASH_INLINE __m256i halves(const T * a, const T * b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) a)),
                                   _mm_loadu_si128((const __m128i *) b), 1);
}
#endif

struct F32Weights {
    using T = float;
    static constexpr bool PREFETCH = false;
    static DFLASH_INLINE __m256 load(const float * p) { return _mm256_loadu_ps(p); }
    static DFLASH_INLINE float scalar(float x) { return x; }
#if defined(__AVX512F__)
    static DFLASH_INLINE __m512 load_pair(const float * a, const float * b) {
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
    }
#endif
};

struct F16Weights {
    using T = ggml_fp16_t;
    static constexpr bool PREFETCH = true;
    static DFLASH_INLINE __m256 load(const ggml_fp16_t * p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p)); }
    static DFLASH_INLINE float scalar(ggml_fp16_t x) { return _cvtsh_ss(x); }
#if defined(__AVX512F__)
    static DFLASH_INLINE __m512 load_pair(const ggml_fp16_t * a, const ggml_fp16_t * b) {
        return _mm512_cvtph_ps(halves(a, b));
    }
#endif
};

// BF16 is the top half of an F32: widened exactly by a shift, so each product and sum is the F32 one (the
// activations stay F32, not rounded to BF16 as ggml's vec_dot rounds them)
struct BF16Weights {
    using T = ggml_bf16_t;
    static constexpr bool PREFETCH = true;
    static DFLASH_INLINE __m256 load(const ggml_bf16_t * p) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *) p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
    static DFLASH_INLINE float scalar(ggml_bf16_t x) {
        const uint32_t bits = (uint32_t) x.bits << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
#if defined(__AVX512F__)
    static DFLASH_INLINE __m512 load_pair(const ggml_bf16_t * a, const ggml_bf16_t * b) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves(a, b)), 16));
    }
#endif
};

DFLASH_INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// C[j0 + j, i0 + i] for i < rm (<= RM), j < RN. `next`: the thread's next tile (or nullptr), fetched in
// step with this one: the hardware prefetcher does not follow RM interleaved rows well (as in
// tile_gemm.h's Tile::prefetch_next).
template <class W, int RN>
DFLASH_NOINLINE void float_tile(int rm, const char * A, size_t a_row_bytes, const float * B, size_t b_row_floats,
                                int64_t k, float * C, int64_t ldc, const char * next) {
    constexpr size_t step_bytes = RM * 8 * sizeof(typename W::T);   // weight bytes one k-step reads
    const typename W::T * w[RM];
    for (int i = 0; i < RM; ++i) {
        w[i] = (const typename W::T *) (A + (i < rm ? i : rm - 1) * a_row_bytes);   // extra rows: dropped
    }
#if defined(__AVX512F__)
    constexpr int PAIRS = RM / 2;
    __m512 acc[PAIRS][RN];          // lanes 0..7: row 2i, lanes 8..15: row 2i + 1
    for (int i = 0; i < PAIRS; ++i) {
        for (int j = 0; j < RN; ++j) {
            acc[i][j] = _mm512_setzero_ps();
        }
    }
#else
    __m256 acc[RM][RN];
    for (int i = 0; i < RM; ++i) {
        for (int j = 0; j < RN; ++j) {
            acc[i][j] = _mm256_setzero_ps();
        }
    }
#endif
    const int64_t k8 = k & ~(int64_t) 7;
    for (int64_t l = 0; l < k8; l += 8) {
        if (W::PREFETCH && next != nullptr) {
            for (size_t off = 0; off < step_bytes; off += 64) {
                _mm_prefetch(next + (l / 8) * step_bytes + off, _MM_HINT_T0);
            }
        }
#if defined(__AVX512F__)
        __m512 x[RN];
        for (int j = 0; j < RN; ++j) {
            x[j] = _mm512_broadcast_f32x8(_mm256_loadu_ps(B + j * b_row_floats + l));
        }
        for (int i = 0; i < PAIRS; ++i) {
            const __m512 wv = W::load_pair(w[2 * i] + l, w[2 * i + 1] + l);
            for (int j = 0; j < RN; ++j) {
                acc[i][j] = _mm512_fmadd_ps(wv, x[j], acc[i][j]);
            }
        }
#else
        __m256 x[RN];
        for (int j = 0; j < RN; ++j) {
            x[j] = _mm256_loadu_ps(B + j * b_row_floats + l);
        }
        for (int i = 0; i < RM; ++i) {
            const __m256 wv = W::load(w[i] + l);
            for (int j = 0; j < RN; ++j) {
                acc[i][j] = _mm256_fmadd_ps(wv, x[j], acc[i][j]);
            }
        }
#endif
    }
    for (int i = 0; i < rm; ++i) {
        for (int j = 0; j < RN; ++j) {
#if defined(__AVX512F__)
            const __m512 pair = acc[i / 2][j];
            float s = hsum(i % 2 ? _mm512_extractf32x8_ps(pair, 1) : _mm512_castps512_ps256(pair));
#else
            float s = hsum(acc[i][j]);
#endif
            for (int64_t l = k8; l < k; ++l) {
                s = __builtin_fmaf(W::scalar(w[i][l]), B[j * b_row_floats + l], s);
            }
            C[j * ldc + i] = s;
        }
    }
}

template <class W>
void float_gemm(int64_t n_rows, int64_t n_cols, int64_t k, const void * A, size_t a_row_bytes, const float * B,
                size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth) {
    const int64_t n_tiles = (n_rows + RM - 1) / RM;
    const int64_t tile0 = n_tiles * ith / nth;
    const int64_t tile1 = n_tiles * (ith + 1) / nth;
    const size_t b_row_floats = b_row_bytes / sizeof(float);
    for (int64_t t = tile0; t < tile1; ++t) {
        const int64_t i0 = t * RM;
        const int rm = (int) (n_rows - i0 < RM ? n_rows - i0 : RM);
        const char * a = (const char *) A + i0 * a_row_bytes;
        const char * next = t + 1 < tile1 ? a + RM * a_row_bytes : nullptr;
        for (int64_t j0 = 0; j0 < n_cols; j0 += RN_MAX) {
            const int rn = (int) (n_cols - j0 < RN_MAX ? n_cols - j0 : RN_MAX);
            const float * b = B + j0 * b_row_floats;
            float * c = C + j0 * ldc + i0;
            const char * pf = j0 == 0 ? next : nullptr;   // the first pass streams the weights
            switch (rn) {
                case 1: float_tile<W, 1>(rm, a, a_row_bytes, b, b_row_floats, k, c, ldc, pf); break;
                case 2: float_tile<W, 2>(rm, a, a_row_bytes, b, b_row_floats, k, c, ldc, pf); break;
                case 3: float_tile<W, 3>(rm, a, a_row_bytes, b, b_row_floats, k, c, ldc, pf); break;
#if defined(__AVX512F__)
                case 4: float_tile<W, 4>(rm, a, a_row_bytes, b, b_row_floats, k, c, ldc, pf); break;
                case 5: float_tile<W, 5>(rm, a, a_row_bytes, b, b_row_floats, k, c, ldc, pf); break;
                case 6: float_tile<W, 6>(rm, a, a_row_bytes, b, b_row_floats, k, c, ldc, pf); break;
                case 7: float_tile<W, 7>(rm, a, a_row_bytes, b, b_row_floats, k, c, ldc, pf); break;
                case 8: float_tile<W, 8>(rm, a, a_row_bytes, b, b_row_floats, k, c, ldc, pf); break;
#endif
                default: GGML_ABORT("dflash cpu float gemm: %d columns per pass", rn);
            }
        }
    }
}

}  // namespace

bool gemm_float(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t k, const void * A, size_t a_row_bytes,
                const float * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth) {
    switch (type) {
        case GGML_TYPE_F32:
            float_gemm<F32Weights>(n_rows, n_cols, k, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth);
            return true;
        case GGML_TYPE_F16:
            float_gemm<F16Weights>(n_rows, n_cols, k, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth);
            return true;
        case GGML_TYPE_BF16:
            float_gemm<BF16Weights>(n_rows, n_cols, k, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth);
            return true;
        default:
            return false;
    }
}

#else

bool gemm_float(enum ggml_type, int64_t, int64_t, int64_t, const void *, size_t, const float *, size_t, float *,
                int64_t, int, int) {
    return false;
}

#endif

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
