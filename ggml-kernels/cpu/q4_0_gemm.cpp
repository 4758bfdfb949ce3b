// dflash-gguf: Q4_0 and Q5_0 weights x Q8_0 activations (see tile_gemm.h).
//
// ggml's definitions (dequantize_row_q4_0 / _q5_0): w = d * (q - 8) with q in 0..15, w = d * (q - 16)
// with q in 0..31 (the fifth bit of value k in bit k of qh). The offset is exact in integers:
// sum(w * a) = d * d_a * (sum(q * p) - offset * sum(p)), offset * sum(p) computed once per activation
// block; then the Q8_0 float step (block_fma), one order for every batch width.

#include "tile_gemm.h"

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

namespace {

// nibbles + 16 in byte j where bit j of `bits` is set (Q5_0's fifth bits)
DFLASH_INLINE __m256i add_fifth_bits(__m256i nibbles, uint32_t bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_mask_add_epi8(nibbles, (__mmask32) bits, nibbles, _mm256_set1_epi8(0x10));
#else
    const __m256i qh = _mm256_set1_epi32((int) bits);
    // byte j picks byte j / 8 of the bits, then tests its bit j % 8
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long) 0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, spread), bit), bit);
    return _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
#endif
}

template <class Self, typename WeightBlock, int QMAX, int OFFSET>
struct Offset32 : Format32<Self, WeightBlock, block_q8_0, QMAX, false> {
    using Block = WeightBlock;
    static constexpr bool TILED = true;
    static constexpr int64_t ROWWISE_MAX = 1;   // one column row-wise: no transpose to pay back (see Q8_0)

    static ColumnScale column_scale(const block_q8_0 & y) { return q8_0_column_scale(y, OFFSET); }

    static DFLASH_INLINE __m256 row_scales(const Block * (&r)[TILE_ROWS]) {
        return load_lanes_f16(r, offsetof(Block, d));
    }

    // exact sum(q * p) - OFFSET * sum(p) of the 8 rows' blocks with one activation block p, lane r = row r
    static DFLASH_INLINE __m256i dot_rows(const Block * (&r)[TILE_ROWS], const int8_t * p, const ColumnScale & c) {
        const __m256i pv = _mm256_loadu_si256((const __m256i *) p);
        __m256i v[TILE_ROWS];
        for (int i = 0; i < TILE_ROWS; ++i) {
            const __m256i q = Self::row_quants(*r[i]);
#if DFLASH_CPU_GEMM_VNNI
            v[i] = DFLASH_DPBUSD(_mm256_setzero_si256(), q, pv);
#else
            static_assert(2 * QMAX * 128 <= 32767, "maddubs pairs overflow int16 for these quants");
            v[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(q, pv), _mm256_set1_epi16(1));
#endif
        }
        return _mm256_sub_epi32(sum_lanes(v), _mm256_set1_epi32(c.bias));
    }
};

struct Q4_0 : Offset32<Q4_0, block_q4_0, 15, 8> {
    static DFLASH_INLINE __m256i row_quants(const block_q4_0 & x) { return nibbles_in_order(x.qs); }

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        if (t.interleaved) {     // the 8 rows' scales (out.m zero), then their nibbles
            interleaved_nibbles(scales_first_block<block_q4_0>(t, b, out), out);
            return;
        }
        const block_q4_0 * r[TILE_ROWS];
        t.rows(b, r);
        unpack_nibbles32(r, offsetof(block_q4_0, qs), out);
        out.d = load_lanes_f16(r, offsetof(block_q4_0, d));
        out.m = _mm256_setzero_ps();
    }
};

// PLANES: an interleaved tile's fifth bits are bit planes, not masks (gemm.h); one instance per layout, chosen per
// call (a test per block took 1.19x the time at B = 1)
template <bool PLANES>
struct Q5_0T : Offset32<Q5_0T<PLANES>, block_q5_0, 31, 16> {
    // value k takes bit k of qh as its fifth bit (0x10)
    static DFLASH_INLINE __m256i row_quants(const block_q5_0 & x) {
        return add_fifth_bits(nibbles_in_order(x.qs), load_u32(x.qh));
    }

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        if (t.interleaved) {     // the 8 rows' scales, q[0..8)'s fifth bits (planes or masks, gemm.h), the nibbles
            const char * fifth = scales_first_block<block_q5_0>(t, b, out);
            interleaved_nibbles(fifth + 4 * TILE_ROWS, out);
            if constexpr (PLANES) {
                add_fifth_bit_planes(_mm256_loadu_si256((const __m256i *) fifth), out);
            } else {
                for (int k = 0; k < 8; ++k) {
                    out.q[k] = add_fifth_bits(out.q[k], load_u32(fifth + 4 * k));
                }
            }
            return;
        }
        const block_q5_0 * r[TILE_ROWS];
        t.rows(b, r);
        unpack_nibbles32(r, offsetof(block_q5_0, qs), out);
        add_fifth_bit_lanes(load_lanes_u32(r, offsetof(block_q5_0, qh)), out);
        out.d = load_lanes_f16(r, offsetof(block_q5_0, d));
        out.m = _mm256_setzero_ps();
    }
};

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

DFLASH_CPU_GEMM_ENTRY(gemm_q4_0, Q4_0)
#if DFLASH_CPU_GEMM_X86
bool gemm_q5_0(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A, size_t a_row_bytes, const void * B,
               size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth, dflash_cpu_next_chunk next_chunk,
               void * pool) {
    tile_gemm<Q5_0T<false>>(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth, next_chunk,
                            pool, false);
    return true;
}
bool gemm_q5_0_interleaved(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A, size_t a_row_bytes,
                           const void * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth,
                           dflash_cpu_next_chunk next_chunk, void * pool) {
    if (dflash_cpu_q5_0_bit_planes()) {
        tile_gemm<Q5_0T<true>>(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth, next_chunk,
                               pool, true);
    } else {
        tile_gemm<Q5_0T<false>>(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth,
                                next_chunk, pool, true);
    }
    return true;
}
#else
DFLASH_CPU_GEMM_ENTRY(gemm_q5_0, Q5_0)
#endif

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
