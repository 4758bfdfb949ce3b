// dflash-gguf: Q8_0 and IQ4_NL weights x Q8_0 activations (see tile_gemm.h).
//
// w = d * q with q in -128..127, a = d_a * p with p in -127..127 (ggml's quantize_row_q8_0). Two ways
// to the exact integer sums sum(q * p) of a block, one float step after them (block_fma), so every
// way gives the same bits:
// - transposed tile: with VNNI, unsigned x signed dot steps take q + 128 (0..255), and
//   sum(q * p) = sum((q + 128) * p) - 128 * sum(p), with 128 * sum(p) computed once per activation
//   block; without VNNI ((q + 128) * p overflows the int16 pairs of maddubs) maddubs(|q|, sign(p, q)),
//   each group's pairs widened to int32 on their own (2 * 128 * 127 < 32768, two of them are not).
//   Every width of Q8_0 weights interleaved at load (gemm.h), whose tiles need no transpose; in ggml's
//   layout only 2+ columns with VNNI.
// - row-wise (dot_rows): each weight row's 32 bytes against the column's 32, reduced to one sum per
//   row. In ggml's layout with VNNI for a single column, where the tile's transpose is not paid back
//   (it measured 1.09-1.27x ggml's vec_dot there); without VNNI for every width, with the pairs of
//   maddubs(|q|, sign(p, q)).

#include "tile_gemm.h"

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

namespace {

// Weights that are signed bytes per block of 32, one fp16 scale d opening the block: Q8_0's quants, and IQ4_NL's
// after its table lookup. Self::row_values gives a row's 32 signed values in order, Self::transposed_values a
// tile's block transposed into lanes (see PackedBlock).
template <class Self, typename WeightBlock>
struct Signed32 : Format32<Self, WeightBlock, block_q8_0, 255, false> {
    using Block = WeightBlock;
    static constexpr bool TILED = true;
#if DFLASH_CPU_GEMM_VNNI
    static constexpr int64_t ROWWISE_MAX = 1;
#else
    static constexpr int64_t ROWWISE_MAX = INT64_MAX;   // in ggml's layout: the transpose costs more than it saves
#endif

    static ColumnScale column_scale(const block_q8_0 & y) { return q8_0_column_scale(y, 128); }

    // d of the 8 rows' blocks, lane r = row r
    static DFLASH_INLINE __m256 row_scales(const Block * (&r)[TILE_ROWS]) {
        return load_lanes_f16(r, 0);
    }

    // exact sum(q * p) of the 8 rows' blocks with one activation block p, lane r = row r
    static DFLASH_INLINE __m256i dot_rows(const Block * (&r)[TILE_ROWS], const int8_t * p, const ColumnScale & c) {
        const __m256i pv = _mm256_loadu_si256((const __m256i *) p);
        __m256i v[TILE_ROWS];
#if DFLASH_CPU_GEMM_VNNI
        const __m256i flip = _mm256_set1_epi8((char) 0x80);   // q + 128 as unsigned bytes
        for (int i = 0; i < TILE_ROWS; ++i) {
            const __m256i q = _mm256_xor_si256(Self::row_values(*r[i]), flip);
            v[i] = DFLASH_DPBUSD(_mm256_setzero_si256(), q, pv);
        }
        return _mm256_sub_epi32(sum_lanes(v), _mm256_set1_epi32(c.bias));
#else
        (void) c;
        const __m256i ones = _mm256_set1_epi16(1);
        for (int i = 0; i < TILE_ROWS; ++i) {
            const __m256i q = Self::row_values(*r[i]);
            const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(pv, q));
            v[i] = _mm256_madd_epi16(pairs, ones);
        }
        return sum_lanes(v);
#endif
    }

    // A transposed block's lanes as the dot steps take them: q + 128 with VNNI, q itself without (flip: the
    // values are stored as q + 128)
    static DFLASH_INLINE __m256i lane_values(__m256i v, bool flipped) {
#if DFLASH_CPU_GEMM_VNNI
        return flipped ? v : _mm256_xor_si256(v, _mm256_set1_epi8((char) 0x80));
#else
        return flipped ? _mm256_xor_si256(v, _mm256_set1_epi8((char) 0x80)) : v;
#endif
    }

    // Block b of a tile in lanes: an interleaved tile's by Self::interleaved_values, a tile in ggml's layout
    // transposed by Self::transposed_values
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        if (t.interleaved) {
            Self::interleaved_values(t, b, out);
            return;
        }
        const Block * r[TILE_ROWS];
        t.rows(b, r);
        Self::transposed_values(r, out);
        for (int k = 0; k < TILE_ROWS; ++k) {
            out.q[k] = lane_values(out.q[k], false);
        }
        out.d = row_scales(r);
        out.m = _mm256_setzero_ps();
    }

#if !DFLASH_CPU_GEMM_VNNI
    // One column's step on a transposed block of signed values: maddubs(|q|, sign(p, q)), each group's pairs
    // widened on their own, then the float step every path takes (block_fma)
    template <class V>
    static DFLASH_INLINE typename V::F column(const PackedBlockT<V> & w, const int8_t * p, const ColumnScale * c,
                                              typename V::F acc) {
        static_assert(V::ROWS == 8, "AVX2 runs 8-row tiles");
        const __m256i ones = _mm256_set1_epi16(1);
        __m256i isum = _mm256_setzero_si256();
        for (int k = 0; k < TILE_ROWS; ++k) {
            const __m256i pk = _mm256_set1_epi32((int) load_u32(p + 4 * k));
            const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w.q[k]), _mm256_sign_epi8(pk, w.q[k]));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, ones));
        }
        return block_fma<Self, V>(isum, w.d, w.m, *c, acc);
    }
#endif
};

struct Q8_0 : Signed32<Q8_0, block_q8_0> {
    static DFLASH_INLINE __m256i row_values(const block_q8_0 & x) {
        return _mm256_loadu_si256((const __m256i *) x.qs);
    }
    // an 8x8 transpose of 32-bit groups
    static DFLASH_INLINE void transposed_values(const block_q8_0 * (&r)[TILE_ROWS], PackedBlock & out) {
        load_transposed(r, offsetof(block_q8_0, qs), out.q);
    }

    // the 8 rows' scales, then word k of the 8 rows, stored as q + 128 (dflash_cpu_interleave): lanes as loaded
    static DFLASH_INLINE void interleaved_values(const Tile & t, int64_t b, PackedBlock & out) {
        const char * words = scales_first_block<block_q8_0>(t, b, out);
        for (int k = 0; k < TILE_ROWS; ++k) {
            out.q[k] = lane_values(_mm256_loadu_si256((const __m256i *) (words + 32 * k)), true);
        }
    }
};

// IQ4_NL (ggml's dequantize_row_iq4_nl): w = d * kvalues_iq4nl[q] with q a nibble, in Q4_0's order (value k the low
// nibble of byte k, value k + 16 its high nibble); a byte shuffle looks the 16 signed values up
struct IQ4_NL : Signed32<IQ4_NL, block_iq4_nl> {
    static DFLASH_INLINE __m256i lookup(__m256i nibbles) {
        const __m256i values = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                                -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
        return _mm256_shuffle_epi8(values, nibbles);
    }
#if DFLASH_CPU_GEMM_VNNI
    static DFLASH_INLINE __m256i row_values(const block_iq4_nl & x) { return lookup(nibbles_in_order(x.qs)); }
#else
    static DFLASH_INLINE __m256i row_values(const block_iq4_nl & x) { return lookup(nibbles_in_order_halves(x.qs)); }
#endif
    static DFLASH_INLINE void transposed_values(const block_iq4_nl * (&r)[TILE_ROWS], PackedBlock & out) {
        unpack_nibbles32(r, offsetof(block_iq4_nl, qs), out);
        for (int k = 0; k < TILE_ROWS; ++k) {
            out.q[k] = lookup(out.q[k]);
        }
    }

    // Q4_0's interleaved layout (the 8 rows' scales, then their nibbles), each nibble looked up
    static DFLASH_INLINE void interleaved_values(const Tile & t, int64_t b, PackedBlock & out) {
        interleaved_nibbles(scales_first_block<block_iq4_nl>(t, b, out), out);
        for (int k = 0; k < TILE_ROWS; ++k) {
            out.q[k] = lane_values(lookup(out.q[k]), false);
        }
    }
};

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

DFLASH_CPU_GEMM_ENTRY(gemm_q8_0, Q8_0)
DFLASH_CPU_GEMM_ENTRY(gemm_iq4_nl, IQ4_NL)

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
