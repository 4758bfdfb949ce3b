// dflash-gguf: Q4_1 weights x Q8_1 activations (see tile_gemm.h).
//
// ggml's definition (ggml_vec_dot_q4_1_q8_1): w = d * q + m with q in 0..15, a = d_a * p, and the
// Q8_1 block carries s = d_a * sum(p), so sum(w * a) = d * d_a * sum(q * p) + m * s.

#include "tile_gemm.h"

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

namespace {

struct Q4_1 {
    using Block = block_q4_1;
    using ActBlock = block_q8_1;
    static constexpr bool FLOAT_MIN = true;
    static constexpr bool TILED = true;           // every batch width through the transposed tile
    static constexpr int64_t ROWWISE_MAX = 0;

    static ColumnScale column_scale(const block_q8_1 & y) {
        const uint32_t ds = load_u32(&y);   // d, then s: the two fp16 that open a block
        return ColumnScale{_cvtsh_ss((unsigned short) (ds & 0xFFFF)), _cvtsh_ss((unsigned short) (ds >> 16)), 0};
    }

    // Block b of a tile, transposed into lanes (see PackedBlock).
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        // per 128-bit lane: d of 4 rows in bytes 0..7, m of the same rows in bytes 8..15
        const __m256i split_dm = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                                  0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
        const block_q4_1 * r[TILE_ROWS];
        t.rows(b, r);
        // 4x4 dword transpose in each 128-bit lane: rows 0..3 in the low lane, rows 4..7 in the high one
        const __m256i x0 = _mm256_loadu2_m128i((const __m128i *) r[4]->qs, (const __m128i *) r[0]->qs);
        const __m256i x1 = _mm256_loadu2_m128i((const __m128i *) r[5]->qs, (const __m128i *) r[1]->qs);
        const __m256i x2 = _mm256_loadu2_m128i((const __m128i *) r[6]->qs, (const __m128i *) r[2]->qs);
        const __m256i x3 = _mm256_loadu2_m128i((const __m128i *) r[7]->qs, (const __m128i *) r[3]->qs);
        const __m256i t0 = _mm256_unpacklo_epi32(x0, x1);
        const __m256i t1 = _mm256_unpackhi_epi32(x0, x1);
        const __m256i t2 = _mm256_unpacklo_epi32(x2, x3);
        const __m256i t3 = _mm256_unpackhi_epi32(x2, x3);
        const __m256i g[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                              _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
        // byte k of qs holds value k (low nibble) and value k + 16 (high nibble)
        for (int k = 0; k < 4; ++k) {
            out.q[k]     = _mm256_and_si256(g[k], low4);
            out.q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(g[k], 4), low4);
        }
        // d and m are the two fp16 that open each block
        const __m256i dm = _mm256_setr_epi32((int) load_u32(r[0]), (int) load_u32(r[1]), (int) load_u32(r[2]),
                                             (int) load_u32(r[3]), (int) load_u32(r[4]), (int) load_u32(r[5]),
                                             (int) load_u32(r[6]), (int) load_u32(r[7]));
        const __m256i sorted = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(dm, split_dm), 0xD8);
        out.d = _mm256_cvtph_ps(_mm256_castsi256_si128(sorted));
        out.m = _mm256_cvtph_ps(_mm256_extracti128_si256(sorted, 1));
    }
};

}  // namespace

bool gemm_q4_1(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A, size_t a_row_bytes,
               const void * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth) {
    tile_gemm<Q4_1>(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth);
    return true;
}

#else

bool gemm_q4_1(int64_t, int64_t, int64_t, const void *, size_t, const void *, size_t, float *, int64_t, int, int) {
    return false;
}

#endif

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
