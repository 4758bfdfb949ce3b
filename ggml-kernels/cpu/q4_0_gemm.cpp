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

template <class Self, typename WeightBlock, int QMAX, int OFFSET>
struct Offset32 {
    using Block = WeightBlock;
    using ActBlock = block_q8_0;
    using Scale = ColumnScale;
    using Packed = PackedBlock;
    static constexpr bool ROW_MAJOR = false;
    static constexpr int MAX_Q = QMAX;
    static constexpr bool FLOAT_MIN = false;
    static constexpr bool TILED = true;
    static constexpr int64_t ROWWISE_MAX = 0;

    static ColumnScale column_scale(const block_q8_0 & y) { return q8_0_column_scale(y, OFFSET); }

    static DFLASH_INLINE __m256 column(const PackedBlock & w, const int8_t * p, const ColumnScale * c, __m256 acc) {
        return column_step_32<Self>(w, p, c, acc);
    }
};

struct Q4_0 : Offset32<Q4_0, block_q4_0, 15, 8> {
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        const block_q4_0 * r[TILE_ROWS];
        t.rows(b, r);
        unpack_nibbles32(r, offsetof(block_q4_0, qs), out);
        out.d = load_lanes_f16(r, offsetof(block_q4_0, d));
        out.m = _mm256_setzero_ps();
    }
};

struct Q5_0 : Offset32<Q5_0, block_q5_0, 31, 16> {
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, PackedBlock & out) {
        const block_q5_0 * r[TILE_ROWS];
        t.rows(b, r);
        unpack_nibbles32(r, offsetof(block_q5_0, qs), out);
        // q[k] byte i (value 4k + i) takes bit 4k + i of its row's qh: byte k / 2 of the lane's word,
        // bit 4 (k % 2) + i of that byte
        const __m256i qh = load_lanes_u32(r, offsetof(block_q5_0, qh));
        const __m256i fifth = _mm256_set1_epi8(0x10);
        for (int k = 0; k < 8; ++k) {
            const char c = (char) (k / 2);
            const __m256i spread = _mm256_setr_epi8(c, c, c, c, c + 4, c + 4, c + 4, c + 4, c + 8, c + 8, c + 8, c + 8,
                                                    c + 12, c + 12, c + 12, c + 12, c, c, c, c, c + 4, c + 4, c + 4,
                                                    c + 4, c + 8, c + 8, c + 8, c + 8, c + 12, c + 12, c + 12, c + 12);
            const int s = 4 * (k % 2);
            const __m256i bit = _mm256_setr_epi8(1 << s, 2 << s, 4 << s, (char) (8 << s), 1 << s, 2 << s, 4 << s,
                                                 (char) (8 << s), 1 << s, 2 << s, 4 << s, (char) (8 << s), 1 << s,
                                                 2 << s, 4 << s, (char) (8 << s), 1 << s, 2 << s, 4 << s,
                                                 (char) (8 << s), 1 << s, 2 << s, 4 << s, (char) (8 << s), 1 << s,
                                                 2 << s, 4 << s, (char) (8 << s), 1 << s, 2 << s, 4 << s,
                                                 (char) (8 << s));
            const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, spread), bit), bit);
            out.q[k] = _mm256_or_si256(out.q[k], _mm256_and_si256(set, fifth));
        }
        out.d = load_lanes_f16(r, offsetof(block_q5_0, d));
        out.m = _mm256_setzero_ps();
    }
};

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

DFLASH_CPU_GEMM_ENTRY(gemm_q4_0, Q4_0)
DFLASH_CPU_GEMM_ENTRY(gemm_q5_0, Q5_0)

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
