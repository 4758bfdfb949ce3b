// dflash-gguf: what the K-quant-style formats share (kquant_gemm.cpp: Q2_K..Q6_K; iquant_gemm.cpp: IQ4_XS and the
// lattice formats IQ3_XXS, IQ3_S): super-blocks of 256 weights in 8 groups of 32 times Q8_K activations, the exact
// integer dot steps of a group scaled per row, and the float steps that finish a super-block (internal to
// ggml-kernels/cpu; see tile_gemm.h).
#pragma once

#include "tile_gemm.h"

#include <cmath>

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

namespace {

constexpr int GROUPS = QK_K / 32;   // groups of 32 per super-block

// One Q8_K activation block: its scale and the sums of its quants, laid out for each path
struct KScale {
    float d;                  // d_a
    int16_t s16[GROUPS];          // sum(p) over each group of 32 (|sum| <= 32 * 127); groups 2k, 2k + 1 read
                                  // together as one 32-bit word by the tile's madd
    int16_t bsums[2 * GROUPS];    // sum(p) over each 16
};

KScale q8_k_column_scale(const block_q8_K & y) {
    KScale c;
    c.d = y.d;
    for (int h = 0; h < 2 * GROUPS; ++h) {
        c.bsums[h] = y.bsums[h];
    }
    for (int g = 0; g < GROUPS; ++g) {
        c.s16[g] = (int16_t) (y.bsums[2 * g] + y.bsums[2 * g + 1]);
    }
    return c;
}

// d (and -dmin) of each row's super-block, lanes = rows
template <class V>
struct KRowScalesT {
    typename V::F d;
    typename V::F neg_dmin;
};

// finish_k for one row (one lane of it): the same operations, so the same bits
template <bool MIN>
DFLASH_INLINE float finish_k_row(int32_t isum, int32_t msum, ggml_half d, ggml_half dmin, const KScale & c, float acc) {
    acc = std::fma((float) isum, _cvtsh_ss(d) * c.d, acc);
    if (MIN) {
        acc = std::fma((float) msum, (0.0f - _cvtsh_ss(dmin)) * c.d, acc);
    }
    return acc;
}

template <bool MIN, class V>
DFLASH_INLINE typename V::F finish_k(typename V::I isum, typename V::I msum, const KRowScalesT<V> & rs, const KScale & c,
                                     typename V::F acc) {
    const typename V::F da = V::set1f(c.d);
    acc = V::fmadd(V::cvt(isum), V::mul(rs.d, da), acc);
    if (MIN) {
        acc = V::fmadd(V::cvt(msum), V::mul(rs.neg_dmin, da), acc);
    }
    return acc;
}

// byte i of each 32-bit lane
template <class V>
DFLASH_INLINE typename V::I lane_byte(typename V::I v, int i) {
    return V::and_(V::srli32(v, 8 * i), V::set1(0xFF));
}

// exact sum(u * p) of 32 unsigned weight bytes u and activation quants p, times a per-lane scale: lanes of
// 4 products (VNNI) or of pairs (AVX2; the scale as int16 in both halves of a lane), summed exactly later
DFLASH_INLINE __m256i scaled_dot32(__m256i u, const int8_t * p, __m256i scale32, __m256i scale16) {
    const __m256i pv = _mm256_loadu_si256((const __m256i *) p);
#if DFLASH_CPU_GEMM_VNNI
    (void) scale16;
    return _mm256_mullo_epi32(DFLASH_DPBUSD(_mm256_setzero_si256(), u, pv), scale32);
#else
    (void) scale32;
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, pv), scale16);
#endif
}

// two int32 lanes' low halves as the int16 pair (lo, hi) of one lane: int16 pairs of scales for madd
template <class V>
DFLASH_INLINE typename V::I pair16(typename V::I lo, typename V::I hi) {
    return V::or_(V::and_(lo, V::set1(0xFFFF)), V::template slli<16>(hi));
}

// Groups of 4 weight quants per scaled dot step in Format::columns: a whole group of 32 where VNNI's registers
// hold it beside RN accumulators, half of one with AVX2's 16 registers
#if DFLASH_CPU_GEMM_VNNI && defined(__AVX512F__)
constexpr int STEP_GROUPS = 8;
#else
constexpr int STEP_GROUPS = 4;
#endif

// Widths K4Format::stream_columns takes (16384 x 2048 interleaved Q4_K weights, 1 thread, in-process A/B against
// unpacking each block first, two to four runs: AVX-512 B = 1..5 0.74-0.96x, 8 0.99-1.03x, 16 1.37x; forced AVX2
// B = 1..3 0.78-0.97x, 4 0.93-1.00x, 5..8 0.96-1.04x; native AVX2 on Zen 3, builds alternating, B = 5 / 6 0.89-0.91x,
// 7 0.99-1.00x, 8 0.96-0.97x, Q5_K 5..8 0.99-1.01x; AVX-VNNI not measured beyond 4)
#if DFLASH_CPU_GEMM_VNNI && !defined(__AVX512F__)
constexpr int K4_STREAM_MAX = 4;
#else
constexpr int K4_STREAM_MAX = 8;
#endif

// isum[j] += sc * sum_k q[k] . (quants 4k..4k+3 of p[j] + at), k < N, for RN columns; sc16: sc as int16 in both
// halves of a lane (AVX2). VNNI interleaves the columns' dpbusd, one chain per column, so consecutive ones do
// not wait for each other (column after column measured 1.05-1.1x slower at B = 5..16: the units sat idle).
template <int RN, int N, int MAX_Q, class V>
DFLASH_INLINE void add_scaled_dots(typename V::I (&isum)[RN], const typename V::I * q, const int8_t * const (&p)[RN],
                                   int at, typename V::I sc, typename V::I sc16) {
#if DFLASH_CPU_GEMM_VNNI
    (void) sc16;
    typename V::I dot[RN];
    for (int j = 0; j < RN; ++j) {
        dot[j] = V::dpbusd(V::zero(), q[0], V::set1((int) load_u32(p[j] + at)));
    }
    for (int k = 1; k < N; ++k) {
        for (int j = 0; j < RN; ++j) {
            dot[j] = V::dpbusd(dot[j], q[k], V::set1((int) load_u32(p[j] + at + 4 * k)));
        }
    }
    for (int j = 0; j < RN; ++j) {
        isum[j] = V::add(isum[j], V::mullo(dot[j], sc));
    }
#else
    // column after column (AVX2's 16 registers: interleaving them measured 1.06-1.33x slower at B = 4..16), the
    // maddubs pair sums |q*p + q*p| <= 2 * MAX_Q * 128 of CHUNK steps summed in int16, then scaled by madd
    (void) sc;
    constexpr int CHUNK = 32767 / (2 * MAX_Q * 128) < N ? 32767 / (2 * MAX_Q * 128) : N;
    for (int j = 0; j < RN; ++j) {
        for (int k0 = 0; k0 < N; k0 += CHUNK) {
            __m256i s16 = _mm256_maddubs_epi16(q[k0], _mm256_set1_epi32((int) load_u32(p[j] + at + 4 * k0)));
            for (int k = k0 + 1; k < k0 + CHUNK && k < N; ++k) {
                s16 = _mm256_add_epi16(
                    s16, _mm256_maddubs_epi16(q[k], _mm256_set1_epi32((int) load_u32(p[j] + at + 4 * k))));
            }
            isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(s16, sc16));
        }
    }
#endif
}

// sum_g m_g * sum(p over group g) of one column, lanes = rows; m_pair holds m of groups 2k, 2k + 1 as two int16
template <class V>
DFLASH_INLINE typename V::I group_sums_times(const typename V::I (&m_pair)[GROUPS / 2], const KScale & c) {
    typename V::I sum = V::zero();
    for (int k = 0; k < GROUPS / 2; ++k) {
        sum = V::add(sum, V::madd16(m_pair[k], V::set1((int) load_u32(c.s16 + 2 * k))));
    }
    return sum;
}

// Format::columns' start: the quants of block b of columns j0..j0+RN, and their integer sums at zero
template <class V, class Format, int RN>
DFLASH_INLINE void start_columns(const Activations<Format> & a, int64_t b, int64_t j0, const int8_t * (&p)[RN],
                                 typename V::I (&isum)[RN]) {
    for (int j = 0; j < RN; ++j) {
        p[j] = a.quants(b, j0 + j);
        isum[j] = V::zero();
    }
}

// A transposed Q4_K / Q5_K block, lanes = rows (IQ4_XS and the lattice formats keep theirs in it too)
template <class V>
struct K4PackedT {
    typename V::I q[GROUPS][8];   // transposed quants of each group (see PackedBlock)
    typename V::I sc[GROUPS];     // 6-bit scales, lanes = rows
    typename V::I m_pair[GROUPS / 2];   // 6-bit mins of groups 2k, 2k + 1 as two int16
    KRowScalesT<V> rs;
};
using K4Packed = K4PackedT<V8>;

// The float steps of the formats without a min term (Q6_K, Q3_K, IQ4_XS): acc += isum * (d * d_a), d the fp16
// that Block keeps as `d`
template <typename Block>
struct FinishWithoutMin {
    static DFLASH_INLINE float finish_row(const Block & x, int32_t isum, int32_t, const KScale & c, float acc) {
        return finish_k_row<false>(isum, 0, x.d, x.d, c, acc);
    }
    template <class V = V8>
    static DFLASH_INLINE typename V::F finish(typename V::I isum, typename V::I msum, const KRowScalesT<V> & rs,
                                              const KScale & c, typename V::F acc) {
        return finish_k<false, V>(isum, msum, rs, c, acc);
    }
};

// What the K-quant formats share: Q8_K activations, the transposed tile, the row-major path up to ROWS columns
template <typename WeightBlock, template <class> class PackedBlocks, int64_t ROWS>
struct KTraits {
    using Block = WeightBlock;
    using ActBlock = block_q8_K;
    using Scale = KScale;
    using Packed = PackedBlocks<V8>;
    template <class V> using PackedT = PackedBlocks<V>;
    static constexpr bool TILED = true;
    static constexpr bool ROW_MAJOR = true;
    static constexpr int64_t ROWWISE_MAX = ROWS;
    static constexpr bool COLUMNS_TOGETHER = true;
    // Columns per call of Format::columns (tile_gemm.h: columns_in_chunks): with VNNI a chunk's dot chains, its integer
    // sums and the group's quants stay in AVX-512's 32 registers (3 x 8 + 8); AVX2 steps column after column anyway
    // (its widest pass, 8)
    static constexpr int COLUMN_CHUNK = 8;
    // 16-row tiles (V16) from 4 columns, where the core runs 512-bit dot steps at full rate (dflash_cpu_wide_k_tiles).
    // Emerald Rapids, 16384 x 2048, 1 thread, in-process A/B against 8-row tiles: Q4_K B = 1 / 2 / 4 / 8 / 16 1.58x /
    // 1.14x / 0.83x / 0.53x / 0.70x the time, Q6_K B = 4 / 8 / 16 0.96x / 0.83x / 0.74x. On Zen 4, before the choice
    // existed: no faster for Q4_K and slower for Q6_K (8 columns x 4 qwen3-0.6b layers, 1 thread: Q4_K 7.9 vs 7.2-8.2
    // ms, Q6_K 16.6 vs 12.3). Where it splits them (Zen 4), from 16 columns: the ~2B qwen3 shape, Q4_K_M, 2 threads,
    // t(B) with pairs against without, two rounds: B = 4 / 8 / 12 / 16 / 24 / 32 / 64 1.35-1.41x / 1.11-1.28x /
    // 0.97-1.16x / 0.94-1.01x / 0.94-1.04x / 0.93-0.98x / 0.86-0.94x the time, a 512-token prefill 0.74x
    static constexpr bool PAIR_TILES = true;
    static constexpr int64_t PAIR_MIN_COLS = 4;
    static constexpr int64_t PAIR_MIN_COLS_SPLIT_RATE = 16;

    static KScale column_scale(const block_q8_K & y) { return q8_k_column_scale(y); }
};

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
