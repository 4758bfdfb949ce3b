// dflash-gguf: Q8_0 weights x Q8_0 activations (see tile_gemm.h).
//
// w = d * q with q in -127..127. The unsigned x signed dot steps take q + 128 (1..255), so
// sum(q * p) = sum((q + 128) * p) - 128 * sum(p), with 128 * sum(p) of each activation block computed
// once per product: exact in integers. The products (q + 128) * p overflow the int16 pairs of AVX2's
// maddubs, so this kernel needs VNNI (vpdpbusd) and is not compiled without it.

#include "tile_gemm.h"

namespace dflash_cpu {

#if DFLASH_CPU_GEMM_VNNI

namespace {

struct Q8_0 {
    using Block = block_q8_0;
    using ActBlock = block_q8_0;
    static constexpr bool FLOAT_MIN = false;

    static ColumnScale column_scale(const block_q8_0 & y) {
        int32_t sum = 0;
        for (int i = 0; i < QK8_0; ++i) {
            sum += y.qs[i];
        }
        uint16_t d;
        memcpy(&d, &y, sizeof d);   // the fp16 that opens a block
        return ColumnScale{_cvtsh_ss(d), 0.0f, 128 * sum};
    }

    // Block b of a tile, transposed into lanes (see PackedBlock): an 8x8 transpose of 32-bit groups.
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        const block_q8_0 * r[TILE_ROWS];
        t.rows(b, r);
        __m256i x[TILE_ROWS];
        for (int i = 0; i < TILE_ROWS; ++i) {
            x[i] = _mm256_loadu_si256((const __m256i *) r[i]->qs);
        }
        // pairs of rows interleaved by 32-bit group, then by 64 bits: u[k] (k < 4) holds groups k and
        // k + 4 of rows 0..3, u[k + 4] the same of rows 4..7
        __m256i u[TILE_ROWS];
        for (int h = 0; h < 2; ++h) {
            const __m256i * y = x + 4 * h;
            const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]);
            const __m256i t1 = _mm256_unpackhi_epi32(y[0], y[1]);
            const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]);
            const __m256i t3 = _mm256_unpackhi_epi32(y[2], y[3]);
            u[4 * h + 0] = _mm256_unpacklo_epi64(t0, t2);
            u[4 * h + 1] = _mm256_unpackhi_epi64(t0, t2);
            u[4 * h + 2] = _mm256_unpacklo_epi64(t1, t3);
            u[4 * h + 3] = _mm256_unpackhi_epi64(t1, t3);
        }
        const __m256i flip = _mm256_set1_epi8((char) 0x80);   // q + 128 as unsigned bytes
        for (int k = 0; k < 4; ++k) {
            out.q[k]     = _mm256_xor_si256(_mm256_permute2x128_si256(u[k], u[k + 4], 0x20), flip);
            out.q[k + 4] = _mm256_xor_si256(_mm256_permute2x128_si256(u[k], u[k + 4], 0x31), flip);
        }
        uint16_t d[TILE_ROWS];
        for (int i = 0; i < TILE_ROWS; ++i) {
            memcpy(&d[i], r[i], sizeof d[i]);
        }
        out.d = _mm256_cvtph_ps(_mm_setr_epi16((short) d[0], (short) d[1], (short) d[2], (short) d[3],
                                               (short) d[4], (short) d[5], (short) d[6], (short) d[7]));
        out.m = _mm256_setzero_ps();
    }
};

}  // namespace

bool gemm_q8_0(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A, size_t a_row_bytes,
               const void * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth) {
    tile_gemm<Q8_0>(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth);
    return true;
}

#else

bool gemm_q8_0(int64_t, int64_t, int64_t, const void *, size_t, const void *, size_t, float *, int64_t, int, int) {
    return false;
}

#endif

}  // namespace dflash_cpu
