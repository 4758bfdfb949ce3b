// dflash-gguf: Q4_1 and Q5_1 weights x Q8_1 activations (see tile_gemm.h).
//
// ggml's definitions (ggml_vec_dot_q4_1_q8_1, _q5_1_q8_1): w = d * q + m with q in 0..15 (Q5_1: 0..31, the fifth
// bit of value k in bit k of qh), a = d_a * p, and the Q8_1 block carries s = d_a * sum(p), so
// sum(w * a) = d * d_a * sum(q * p) + m * s.

#include "tile_gemm.h"

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

namespace {

// What Q4_1 and Q5_1 share: Q8_1 activations, every batch width through the transposed tile
template <class Self, typename WeightBlock, int QMAX>
struct WithMin32 : Format32<Self, WeightBlock, block_q8_1, QMAX, true> {
    static constexpr bool TILED = true;
    static constexpr int64_t ROWWISE_MAX = 0;

    static ColumnScale column_scale(const block_q8_1 & y) {
        const uint32_t ds = load_u32(&y);   // d, then s: the two fp16 that open a block
        return ColumnScale{_cvtsh_ss((unsigned short) (ds & 0xFFFF)), _cvtsh_ss((unsigned short) (ds >> 16)), 0};
    }

    // d and m, the two fp16 that open each row's block, lanes = rows
    template <typename Block>
    static DFLASH_INLINE void row_scales(const Block * const (&r)[TILE_ROWS], PackedBlock & out) {
        out.d = load_lanes_f16(r, 0);
        out.m = load_lanes_f16(r, sizeof(ggml_half));
    }

    // the same from an interleaved block, whose word 0 holds the 8 rows' d and m
    static DFLASH_INLINE void interleaved_row_scales(const char * block, PackedBlock & out) {
        const __m256i dm = _mm256_loadu_si256((const __m256i *) block);
        out.d = f16_half_lanes(dm, false);
        out.m = f16_half_lanes(dm, true);
    }
};

struct Q4_1 : WithMin32<Q4_1, block_q4_1, 15> {
    // Block b of a tile, transposed into lanes (see PackedBlock).
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        if (t.interleaved) {     // word 0 of the 8 rows (d, then m), then their nibbles (interleaved_nibbles)
            const char * block = t.interleaved_block<block_q4_1>(b);
            interleaved_row_scales(block, out);
            interleaved_nibbles(block + 32, out);
            return;
        }
        const block_q4_1 * r[TILE_ROWS];
        t.rows(b, r);
        unpack_nibbles32(r, offsetof(block_q4_1, qs), out);
        row_scales(r, out);
    }
};

struct Q5_1 : WithMin32<Q5_1, block_q5_1, 31> {
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        if (t.interleaved) {     // word 0 of the 8 rows (d, then m), word 1 their fifth bits as planes, the nibbles
            const char * block = t.interleaved_block<block_q5_1>(b);
            interleaved_row_scales(block, out);
            interleaved_nibbles(block + 64, out);
            add_fifth_bit_planes(_mm256_loadu_si256((const __m256i *) (block + 32)), out);
            return;
        }
        const block_q5_1 * r[TILE_ROWS];
        t.rows(b, r);
        unpack_nibbles32(r, offsetof(block_q5_1, qs), out);
        add_fifth_bit_lanes(load_lanes_u32(r, offsetof(block_q5_1, qh)), out);
        row_scales(r, out);
    }
};

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

DFLASH_CPU_GEMM_ENTRY(gemm_q4_1, Q4_1)
DFLASH_CPU_GEMM_ENTRY(gemm_q5_1, Q5_1)

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
