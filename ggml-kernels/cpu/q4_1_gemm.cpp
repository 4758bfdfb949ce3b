// dflash-gguf: Q4_1 weights x Q8_1 activations (see tile_gemm.h).
//
// ggml's definition (ggml_vec_dot_q4_1_q8_1): w = d * q + m with q in 0..15, a = d_a * p, and the
// Q8_1 block carries s = d_a * sum(p), so sum(w * a) = d * d_a * sum(q * p) + m * s.

#include "tile_gemm.h"

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

namespace {

struct Q4_1 : Format32<Q4_1, block_q4_1, block_q8_1, 15, true> {
    static constexpr bool TILED = true;           // every batch width through the transposed tile
    static constexpr int64_t ROWWISE_MAX = 0;

    static ColumnScale column_scale(const block_q8_1 & y) {
        const uint32_t ds = load_u32(&y);   // d, then s: the two fp16 that open a block
        return ColumnScale{_cvtsh_ss((unsigned short) (ds & 0xFFFF)), _cvtsh_ss((unsigned short) (ds >> 16)), 0};
    }

    // Block b of a tile, transposed into lanes (see PackedBlock).
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        if (t.interleaved) {     // word 0 of the 8 rows (d, then m), then their nibbles (interleaved_nibbles)
            const char * block = t.interleaved_block<block_q4_1>(b);
            const __m256i dm = _mm256_loadu_si256((const __m256i *) block);
            out.d = f16_half_lanes(dm, false);
            out.m = f16_half_lanes(dm, true);
            interleaved_nibbles(block + 32, out);
            return;
        }
        const block_q4_1 * r[TILE_ROWS];
        t.rows(b, r);
        unpack_nibbles32(r, offsetof(block_q4_1, qs), out);
        out.d = load_lanes_f16(r, 0);                   // d and m: the two fp16 that open each block
        out.m = load_lanes_f16(r, sizeof(ggml_half));
    }
};

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

DFLASH_CPU_GEMM_ENTRY(gemm_q4_1, Q4_1)

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
