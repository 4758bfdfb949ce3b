// dflash-gguf: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights x Q8_K activations (see tile_gemm.h, kquant.h).
//
// ggml's definitions (dequantize_row_q2_K / _q3_K / _q4_K / _q5_K / _q6_K), per super-block of 256 weights:
// - Q4_K / Q5_K: 8 groups of 32, w = d * sc_g * q - dmin * m_g with q in 0..15 (Q5_K: 0..31, the fifth
//   bit of group g in bit g of qh), sc_g and m_g 6-bit;
// - Q6_K: 16 halves of 16, w = d * sc_h * (q - 32) with q in 0..63, sc_h a signed byte;
// - Q3_K: 16 halves of 16, w = d * sc_h * (q - 4) with q in 0..7 (its third bit the hmask bit), sc_h 6-bit - 32;
// - Q2_K: 16 halves of 16, w = d * sc_h * q - dmin * m_h with q in 0..3, sc_h and m_h 4-bit.
// Q8_K activations: a = d_a * p, with the sums of p over each 16 (bsums).
// Per row, super-block and column two exact integers, as ggml's vec_dot sums them:
//   isum = sum_g sc_g * sum(q * p)       (Q6_K: sum_h sc_h * (sum(q * p) - 32 * sum(p)); Q3_K: - 4 * sum(p))
//   msum = sum_g m_g * sum(p)            (Q4_K / Q5_K; Q2_K: sum_h m_h * sum(p))
// then the float steps (finish): acc += isum * (d * d_a), acc += msum * (-dmin * d_a). The transposed tile
// (lanes = rows) and the row-major path of one column get the same integers, so every batch width gives the
// same bits; a verify row equals the token decoded alone.

#include "kquant.h"

#include <chrono>
#include <cmath>

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

namespace {

// ---- Q4_K and Q5_K ----

// get_scale_min_k4 for all 8 groups of one row, as ggml's vec_dot unpacks them: bytes 0..7 the scales,
// bytes 8..15 the mins
DFLASH_INLINE __m128i scales_mins(const uint8_t * s) {
    uint32_t u[4];
    memcpy(u, s, 12);
    const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    u[3] = ((u[2] >> 4) & four) | (((u[1] >> 6) & two) << 4);
    const uint32_t mins_lo = u[1] & six;
    u[1] = (u[2] & four) | (((u[0] >> 6) & two) << 4);
    u[2] = mins_lo;
    u[0] &= six;
    return _mm_loadu_si128((const __m128i *) u);
}

// The same, lanes = rows, for the transposed tile
template <class V, typename Row>
DFLASH_INLINE void unpack_scales_mins(const TileRows<Row> & r, K4PackedT<V> & out) {
    using I = typename V::I;
    const size_t at = offsetof(Row, scales);
    const I a0 = r.lanes_u32(at);       // scales[0..3]: sc_0..3 (low 6 bits), high bits of sc_4..7
    const I a1 = r.lanes_u32(at + 4);   // scales[4..7]: m_0..3, high bits of m_4..7
    const I a2 = r.lanes_u32(at + 8);   // scales[8..11]: low 4 bits of sc_4..7 and m_4..7
    const I six = V::set1(63);
    const I four = V::set1(15);
    I m[GROUPS];
    for (int g = 0; g < 4; ++g) {
        const I b2 = lane_byte<V>(a2, g);
        out.sc[g] = V::and_(lane_byte<V>(a0, g), six);
        m[g] = V::and_(lane_byte<V>(a1, g), six);
        out.sc[g + 4] = V::or_(V::and_(b2, four), V::slli32(V::srli32(lane_byte<V>(a0, g), 6), 4));
        m[g + 4] = V::or_(V::srli32(b2, 4), V::slli32(V::srli32(lane_byte<V>(a1, g), 6), 4));
    }
    for (int k = 0; k < GROUPS / 2; ++k) {
        out.m_pair[k] = V::or_(m[2 * k], V::slli32(m[2 * k + 1], 16));
    }
    out.rs = KRowScalesT<V>{r.lanes_f16(0), V::neg(r.lanes_f16(sizeof(ggml_half)))};
}

// The 4-bit quants of Q4_K / Q5_K rows: 32 bytes per pair of groups, group 2c in the low nibbles of
// bytes 32c.., group 2c + 1 in the high ones
template <class V, typename Row>
DFLASH_INLINE void unpack_low_nibbles(const TileRows<Row> & r, K4PackedT<V> & out) {
    const typename V::I low4 = V::set1_8(0x0F);
    for (int c = 0; c < GROUPS / 2; ++c) {
        typename V::I g[TILE_ROWS];
        r.transposed(offsetof(Row, qs) + 32 * c, g);
        for (int k = 0; k < TILE_ROWS; ++k) {
            out.q[2 * c][k] = V::and_(g[k], low4);
            out.q[2 * c + 1][k] = V::and_(V::srli16(g[k], 4), low4);
        }
    }
}

// bit g of each byte moved to bit TO, the others cleared (16-bit shifts: bits crossing bytes land outside bit TO):
// Q5_K's fifth bits (TO = 4), Q3_K's third (TO = 2)
template <int TO, class V = V8>
DFLASH_INLINE typename V::I moved_bit(typename V::I h, int g) {
    const typename V::I moved = g < TO ? V::slli16(h, TO - g) : V::srli16(h, g - TO);
    return V::and_(moved, V::set1_8(1 << TO));
}

// The float steps of the formats with a min term (Q4_K, Q5_K, Q2_K): acc += isum * (d * d_a), then
// acc += msum * (-dmin * d_a)
struct FinishWithMin {
    template <class V = V8>
    static DFLASH_INLINE typename V::F finish(typename V::I isum, typename V::I msum, const KRowScalesT<V> & rs,
                                              const KScale & c, typename V::F acc) {
        return finish_k<true, V>(isum, msum, rs, c, acc);
    }
};

// row-major for one column only: with the columns of a tile stepped together the transposed tile wins from 2
// (16384 x 1024 weights, 1 thread, in-process A/B: Q4_K 0.84x / 0.66x the row-major time at B = 2 / 3 on
// AVX-512, 0.75x / 0.63x on AVX2; Q5_K 0.80-0.91x)
template <class Self, typename WeightBlock, int QMAX>
struct K4Format : KTraits<WeightBlock, K4PackedT, 1>, FinishWithMin {
    using Block = WeightBlock;
    static DFLASH_INLINE float finish_row(const Block & x, int32_t isum, int32_t msum, const KScale & c, float acc) {
        ggml_half d[2];   // d, dmin: the two fp16 that open the block
        memcpy(d, &x, sizeof d);
        return finish_k_row<true>(isum, msum, d[0], d[1], c, acc);
    }

    // acc[j] += the block's integer sums of column j0 + j (isum[j], and the mins' term) in float
    template <int RN, class V>
    static DFLASH_INLINE void finish_columns(const K4PackedT<V> & w, const Activations<Self> & a, int64_t b, int64_t j0,
                                             const typename V::I (&isum)[RN], typename V::F * acc) {
        for (int j = 0; j < RN; ++j) {
            const KScale & c = *a.scales(b, j0 + j);
            acc[j] = finish<V>(isum[j], group_sums_times<V>(w.m_pair, c), w.rs, c, acc[j]);
        }
    }

    // every column of one unpacked block: each part of a group's quants stays in registers for all RN columns
    template <int RN, class V>
    static DFLASH_INLINE void columns(const K4PackedT<V> & w, const Activations<Self> & a, int64_t b, int64_t j0,
                                      typename V::F * acc) {
        const int8_t * p[RN];
        typename V::I isum[RN];
        start_columns<V>(a, b, j0, p, isum);
        for (int g = 0; g < GROUPS; ++g) {
            const typename V::I sc16 = pair16<V>(w.sc[g], w.sc[g]);
            for (int k = 0; k < 8; k += STEP_GROUPS) {
                add_scaled_dots<RN, STEP_GROUPS, QMAX, V>(isum, w.q[g] + k, p, 32 * g + 4 * k, w.sc[g], sc16);
            }
        }
        finish_columns<RN, V>(w, a, b, j0, isum, acc);
    }

    // Narrow batches on an interleaved tile: each STEP_GROUPS words of a pair of groups are read, split into the two
    // groups' quants and dotted with every column while in registers (unpacking the whole block first, 64 vectors,
    // spilled it to the stack and read it back). The same integer sums as columns(), so the same bits.
    static constexpr int STREAM_MAX = K4_STREAM_MAX;
    template <int RN>
    static DFLASH_INLINE void stream_columns(const Tile & t, int64_t b, const Activations<Self> & a, int64_t j0,
                                             __m256 * acc) {
        using V = V8;
        const TileRows<Block> r(t, b);
        K4PackedT<V> w;          // its scales only
        unpack_scales_mins(r, w);
        const int8_t * p[RN];
        typename V::I isum[RN];
        start_columns<V>(a, b, j0, p, isum);
        const typename V::I low4 = V::set1_8(0x0F);
        for (int c = 0; c < GROUPS / 2; ++c) {
            for (int k0 = 0; k0 < 8; k0 += STEP_GROUPS) {
                typename V::I lo[STEP_GROUPS], hi[STEP_GROUPS];
                for (int k = 0; k < STEP_GROUPS; ++k) {
                    const typename V::I word = r.lanes_u32(offsetof(Block, qs) + 32 * c + 4 * (k0 + k));
                    lo[k] = V::and_(word, low4);
                    hi[k] = V::and_(V::srli16(word, 4), low4);
                    if constexpr (QMAX > 15) {   // Q5_K: bit g of qh[l] is the fifth bit of value l of group g
                        const typename V::I h = r.lanes_u32(offsetof(Block, qh) + 4 * (k0 + k));
                        lo[k] = V::or_(lo[k], moved_bit<4, V>(h, 2 * c));
                        hi[k] = V::or_(hi[k], moved_bit<4, V>(h, 2 * c + 1));
                    }
                }
                const int g = 2 * c;
                add_scaled_dots<RN, STEP_GROUPS, QMAX, V>(isum, lo, p, 32 * g + 4 * k0, w.sc[g], pair16<V>(w.sc[g], w.sc[g]));
                add_scaled_dots<RN, STEP_GROUPS, QMAX, V>(isum, hi, p, 32 * (g + 1) + 4 * k0, w.sc[g + 1],
                                                          pair16<V>(w.sc[g + 1], w.sc[g + 1]));
            }
        }
        finish_columns<RN, V>(w, a, b, j0, isum, acc);
    }

    template <int RN>
    static DFLASH_INLINE void row_sums(const Block & x, const int8_t * const (&p)[RN], const KScale * const (&c)[RN],
                                       int32_t (&isum)[RN], int32_t (&msum)[RN]) {
        const __m128i sm = scales_mins(x.scales);
        const __m128i m16 = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
        for (int j = 0; j < RN; ++j) {
            msum[j] = hsum_i32_128(_mm_madd_epi16(m16, _mm_loadu_si128((const __m128i *) c[j]->s16)));
        }
        // each group's scale in every lane, as int32 (VNNI) and as int16 in both halves of a lane (AVX2)
        const __m256i sc32 = _mm256_cvtepu8_epi32(sm);
        const __m256i sc32x2 = _mm256_or_si256(sc32, _mm256_slli_epi32(sc32, 16));
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        __m256i acc[RN];
        for (int j = 0; j < RN; ++j) {
            acc[j] = _mm256_setzero_si256();
        }
        for (int k = 0; k < GROUPS / 2; ++k) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i *) (x.qs + 32 * k));
            __m256i lo = _mm256_and_si256(bytes, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
            Self::add_fifth_bits(x, 2 * k, lo, hi);
            const int g = 2 * k;
            const __m256i pick_lo = _mm256_set1_epi32(g), pick_hi = _mm256_set1_epi32(g + 1);
            const __m256i sc_lo32 = _mm256_permutevar8x32_epi32(sc32, pick_lo);
            const __m256i sc_hi32 = _mm256_permutevar8x32_epi32(sc32, pick_hi);
            const __m256i sc_lo16 = _mm256_permutevar8x32_epi32(sc32x2, pick_lo);
            const __m256i sc_hi16 = _mm256_permutevar8x32_epi32(sc32x2, pick_hi);
            for (int j = 0; j < RN; ++j) {
                acc[j] = _mm256_add_epi32(acc[j], scaled_dot32(lo, p[j] + 32 * g, sc_lo32, sc_lo16));
                acc[j] = _mm256_add_epi32(acc[j], scaled_dot32(hi, p[j] + 32 * g + 32, sc_hi32, sc_hi16));
            }
        }
        for (int j = 0; j < RN; ++j) {
            isum[j] = hsum_i32(acc[j]);
        }
    }
};

struct Q4_K : K4Format<Q4_K, block_q4_K, 15> {
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, K4Packed & out) {
        const TileRows<block_q4_K> r(t, b);
        unpack_low_nibbles(r, out);
        unpack_scales_mins(r, out);
    }
    static DFLASH_INLINE void add_fifth_bits(const block_q4_K &, int, __m256i &, __m256i &) {}
};

struct Q5_K : K4Format<Q5_K, block_q5_K, 31> {
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, K4Packed & out) {
        using V = V8;
        const TileRows<block_q5_K> r(t, b);
        unpack_low_nibbles(r, out);
        // value l of group g (byte l of the group's 32) takes bit g of qh[l]; transposed, lane byte j of
        // h[k] is qh[4k + j], the same positions as the group's q[k]
        typename V::I h[TILE_ROWS];
        r.transposed(offsetof(block_q5_K, qh), h);
        for (int g = 0; g < GROUPS; ++g) {
            for (int k = 0; k < TILE_ROWS; ++k) {
                out.q[g][k] = V::or_(out.q[g][k], moved_bit<4, V>(h[k], g));
            }
        }
        unpack_scales_mins(r, out);
    }
    // the fifth bits of groups g and g + 1 (bits g, g + 1 of qh[l]) into a row's quants
    static DFLASH_INLINE void add_fifth_bits(const block_q5_K & x, int g, __m256i & lo, __m256i & hi) {
        const __m256i h = _mm256_loadu_si256((const __m256i *) x.qh);
        lo = _mm256_or_si256(lo, moved_bit<4>(h, g));
        hi = _mm256_or_si256(hi, moved_bit<4>(h, g + 1));
    }
};

// ---- Q6_K ----
// Group g = 4n + t (half n of the super-block, quarter t) holds values 128n + 32t + l, l < 32: the low 4 bits
// from ql[64n + 32 (t % 2) + l] (low nibble for t < 2, high for t >= 2), the high 2 from bits 2t, 2t + 1 of
// qh[32n + l]; value v has scale sc[v / 16].

template <class V>
struct K6PackedT {
    typename V::I q[GROUPS][8];     // transposed: q[g][0..3] the group's first 16 values, q[g][4..7] its second 16
    typename V::I sc_lo[GROUPS];    // scale of the first 16, lanes = rows
    typename V::I sc_hi[GROUPS];    // of the second 16
    KRowScalesT<V> rs;
};
using K6Packed = K6PackedT<V8>;

// Offset of half_group_columns for a format whose halves of 16 carry a min instead of an offset (Q2_K)
constexpr int MIN_PER_HALF = -1;

// Every column of one unpacked block of a format with 16 scales of 16 and quants q in 0..MAX_Q offset by
// 2^OFFSET_LOG2 (Q6_K, Q3_K), each half-group's quants in registers for all RN columns:
// isum = sum_h sc_h * sum(q * p) - 2^OFFSET_LOG2 * sum_h sc_h * sum(p), the offset term by int16 pairs of scales;
// with OFFSET_LOG2 = MIN_PER_HALF (Q2_K) no offset, and msum = sum_h m_h * sum(p) by int16 pairs of mins (w.m_pair)
template <class Format, int MAX_Q, int OFFSET_LOG2, int RN, class V, class P>
DFLASH_INLINE void half_group_columns(const P & w, const Activations<Format> & a, int64_t b, int64_t j0,
                                      typename V::F * acc) {
    const int8_t * p[RN];
    typename V::I isum[RN];
    start_columns<V>(a, b, j0, p, isum);
    for (int g = 0; g < GROUPS; ++g) {
        for (int half = 0; half < 2; ++half) {
            const typename V::I sc = half ? w.sc_hi[g] : w.sc_lo[g];
            add_scaled_dots<RN, 4, MAX_Q, V>(isum, w.q[g] + 4 * half, p, 32 * g + 16 * half, sc, pair16<V>(sc, sc));
        }
    }
    // per column, sum_h x_h * sum(p over half h) from int16 pairs x of halves 2g, 2g + 1
    const auto paired_sums = [&](const typename V::I (&pair)[GROUPS], const KScale & c) {
        typename V::I sum = V::zero();
        for (int g = 0; g < GROUPS; ++g) {
            sum = V::add(sum, V::madd16(pair[g], V::set1((int) load_u32(c.bsums + 2 * g))));
        }
        return sum;
    };
    if constexpr (OFFSET_LOG2 == MIN_PER_HALF) {
        for (int j = 0; j < RN; ++j) {
            const KScale & c = *a.scales(b, j0 + j);
            acc[j] = Format::template finish<V>(isum[j], paired_sums(w.m_pair, c), w.rs, c, acc[j]);
        }
    } else {
        typename V::I sc_pair[GROUPS];   // scales of halves 2g, 2g + 1 as two int16
        for (int g = 0; g < GROUPS; ++g) {
            sc_pair[g] = pair16<V>(w.sc_lo[g], w.sc_hi[g]);
        }
        for (int j = 0; j < RN; ++j) {
            const KScale & c = *a.scales(b, j0 + j);
            const typename V::I offset = paired_sums(sc_pair, c);
            acc[j] = Format::template finish<V>(V::sub(isum[j], V::template slli<OFFSET_LOG2>(offset)), V::zero(),
                                                w.rs, c, acc[j]);
        }
    }
}

// the 6-bit quants of group 4n + t from its low-bits bytes l and high-bits bytes h (either layout)
template <class V = V8>
DFLASH_INLINE typename V::I q6_group(typename V::I l, typename V::I h, int t) {
    const typename V::I lo = t >= 2 ? V::and_(V::srli16(l, 4), V::set1_8(0x0F)) : V::and_(l, V::set1_8(0x0F));
    // bits 2t, 2t + 1 of each byte to bits 4, 5
    const typename V::I hi = t < 2 ? V::slli16(h, 4 - 2 * t) : t == 2 ? h : V::srli16(h, 2);
    return V::or_(lo, V::and_(hi, V::set1_8(0x30)));
}

// Weights in ggml's layout (tiles of 8 rows are interleaved: gemm.h), whose transposed unpack (6-bit quants from two
// places) costs more: row-major up to 3 columns with VNNI, 4 without (same A/B: transposed at B = 2 / 4 took 1.10x /
// 0.88x on AVX-512, 1.18x / 1.17x on AVX2). Interleaved tiles are unpacked whole at every width: streaming each
// half-group's words into the columns as Q4_K does took 1.23x / 1.19x / 1.16x the time at B = 1 / 2 / 8 (AVX-512,
// 16384 x 2048, one thread, in process).
#if DFLASH_CPU_GEMM_VNNI
constexpr int64_t Q6_K_ROWWISE_MAX = 3;
#else
constexpr int64_t Q6_K_ROWWISE_MAX = 4;
#endif
struct Q6_K : KTraits<block_q6_K, K6PackedT, Q6_K_ROWWISE_MAX>, FinishWithoutMin<block_q6_K> {
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, K6Packed & out) {
        using V = V8;
        using I = typename V::I;
        const TileRows<block_q6_K> r(t, b);
        for (int n = 0; n < 2; ++n) {
            I h[TILE_ROWS];
            r.transposed(offsetof(block_q6_K, qh) + 32 * n, h);
            for (int half = 0; half < 2; ++half) {
                I l[TILE_ROWS];
                r.transposed(offsetof(block_q6_K, ql) + 64 * n + 32 * half, l);
                for (int nib = 0; nib < 2; ++nib) {
                    const int tq = 2 * nib + half;
                    for (int k = 0; k < TILE_ROWS; ++k) {
                        out.q[4 * n + tq][k] = q6_group<V>(l[k], h[k], tq);
                    }
                }
            }
        }
        // sc[j] signed bytes, lanes = rows: byte j % 4 of word j / 4, sign-extended
        I words[4];
        for (int w = 0; w < 4; ++w) {
            words[w] = r.lanes_u32(offsetof(block_q6_K, scales) + 4 * w);
        }
        for (int g = 0; g < GROUPS; ++g) {
            const int j = 2 * g;   // scales j, j + 1: the same word (j % 4 is 0 or 2)
            out.sc_lo[g] = V::srai32(V::slli32(words[j / 4], 24 - 8 * (j % 4)), 24);
            out.sc_hi[g] = V::srai32(V::slli32(words[j / 4], 16 - 8 * (j % 4)), 24);
        }
        out.rs = KRowScalesT<V>{r.lanes_f16(offsetof(block_q6_K, d)), V::zerof()};
    }

    // every column of one unpacked block: isum = sum_h sc_h * (sum(q * p) - 32 * sum(p))
    template <int RN, class V>
    static DFLASH_INLINE void columns(const K6PackedT<V> & w, const Activations<Q6_K> & a, int64_t b, int64_t j0,
                                      typename V::F * acc) {
        half_group_columns<Q6_K, 63, 5, RN, V>(w, a, b, j0, acc);
    }

    template <int RN>
    static DFLASH_INLINE void row_sums(const block_q6_K & x, const int8_t * const (&p)[RN], const KScale * const (&c)[RN],
                                       int32_t (&isum)[RN], int32_t (&msum)[RN]) {
        __m256i acc[RN];
        for (int j = 0; j < RN; ++j) {
            acc[j] = _mm256_setzero_si256();
        }
        const __m128i scales8 = _mm_loadu_si128((const __m128i *) x.scales);
        // the 16 scales as int32 (halves 0..7, 8..15) and as int16 in both halves of a lane (AVX2's madd)
        const __m256i sc32_of[2] = {_mm256_cvtepi8_epi32(scales8), _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(scales8, scales8))};
        const __m256i sc32x2_of[2] = {pair16<V8>(sc32_of[0], sc32_of[0]), pair16<V8>(sc32_of[1], sc32_of[1])};
        for (int n = 0; n < 2; ++n) {
            const __m256i h = _mm256_loadu_si256((const __m256i *) (x.qh + 32 * n));
            for (int half = 0; half < 2; ++half) {
                const __m256i l = _mm256_loadu_si256((const __m256i *) (x.ql + 64 * n + 32 * half));
                for (int nib = 0; nib < 2; ++nib) {
                    const int tq = 2 * nib + half;
                    const int g = 4 * n + tq;
                    const __m256i q = q6_group(l, h, tq);
                    // [sc_2g x 4, sc_2g+1 x 4]: scales 2g, 2g + 1 are lanes 2g % 8, 2g % 8 + 1 of sc32_of[g / 4]
                    const int s0 = (2 * g) % 8;
                    const __m256i pick = _mm256_setr_epi32(s0, s0, s0, s0, s0 + 1, s0 + 1, s0 + 1, s0 + 1);
                    const __m256i sc32 = _mm256_permutevar8x32_epi32(sc32_of[g / 4], pick);
                    const __m256i sc16 = _mm256_permutevar8x32_epi32(sc32x2_of[g / 4], pick);
                    for (int j = 0; j < RN; ++j) {
                        acc[j] = _mm256_add_epi32(acc[j], scaled_dot32(q, p[j] + 32 * g, sc32, sc16));
                    }
                }
            }
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(scales8);
        for (int j = 0; j < RN; ++j) {   // minus sum_h sc_h * 32 * sum(p) over half h, then one horizontal sum
            const __m256i bias = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *) c[j]->bsums));
            isum[j] = hsum_i32(_mm256_sub_epi32(acc[j], _mm256_slli_epi32(bias, 5)));
            msum[j] = 0;
        }
    }
};

// ---- Q3_K ----
// Group g = 4n + j (half n of the super-block, shift j) holds values 128n + 32j + l, l < 32: the low 2 bits are
// bits 2j, 2j + 1 of qs[32n + l], the third is bit g of hmask[l]; value v has scale sc[v / 16], six bits: the low
// four in nibble v / 16 / 8 of scales[v / 16 % 8], the high two in bits 2 (v / 16 / 4) of scales[8 + v / 16 % 4].
// The same scheme as Q6_K (halves of 16, the offset term by int16 pairs of scales), with q in 0..7 and offset 4.

// bits 2j, 2j + 1 of each qs byte of a half: the quants of its group j (Q2_K), their two low bits (Q3_K)
template <class V = V8>
DFLASH_INLINE typename V::I two_bits(typename V::I qs, int j) {
    return V::and_(V::srli16(qs, 2 * j), V::set1_8(0x03));
}

// the 3-bit quants of group 4n + j from the qs bytes of half n and the hmask bytes (either layout, any width)
template <class V = V8>
DFLASH_INLINE typename V::I q3_group(typename V::I qs, typename V::I hm, int n, int j) {
    return V::or_(two_bits<V>(qs, j), moved_bit<2, V>(hm, 4 * n + j));
}

// Every width takes the transposed tile: ggml's layout read row by row took 1.7x its time at one column (2048 x
// 2048 weights, one thread, AVX-512: 0.41 against 0.24 ms; ggml's own vec_dot 0.20)
struct Q3_K : KTraits<block_q3_K, K6PackedT, 0>, FinishWithoutMin<block_q3_K> {

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, K6Packed & out) {
        using V = V8;
        using I = typename V::I;
        const TileRows<block_q3_K> r(t, b);
        I hm[TILE_ROWS];
        r.transposed(offsetof(block_q3_K, hmask), hm);
        for (int n = 0; n < 2; ++n) {
            I qs[TILE_ROWS];
            r.transposed(offsetof(block_q3_K, qs) + 32 * n, qs);
            for (int j = 0; j < 4; ++j) {
                for (int k = 0; k < TILE_ROWS; ++k) {
                    out.q[4 * n + j][k] = q3_group<V>(qs[k], hm[k], n, j);
                }
            }
        }
        // scale h, lanes = rows: its low four bits from byte h % 8 (nibble h / 8), its high two from byte 8 + h % 4
        // (bits 2 (h / 4)); bytes 0..3, 4..7, 8..11 are the words lo0, lo1, hi
        const I lo[2] = {r.lanes_u32(offsetof(block_q3_K, scales)), r.lanes_u32(offsetof(block_q3_K, scales) + 4)};
        const I hi = r.lanes_u32(offsetof(block_q3_K, scales) + 8);
        I sc[2 * GROUPS];
        for (int h = 0; h < 2 * GROUPS; ++h) {
            const int byte = h % 8;
            const I low4 = V::and_(V::srli32(lo[byte / 4], 8 * (byte % 4) + 4 * (h / 8)), V::set1(0xF));
            const I high2 = V::and_(V::srli32(hi, 8 * (h % 4) + 2 * (h / 4)), V::set1(3));
            sc[h] = V::sub(V::or_(low4, V::slli32(high2, 4)), V::set1(32));
        }
        for (int g = 0; g < GROUPS; ++g) {
            out.sc_lo[g] = sc[2 * g];
            out.sc_hi[g] = sc[2 * g + 1];
        }
        out.rs = KRowScalesT<V>{r.lanes_f16(offsetof(block_q3_K, d)), V::zerof()};
    }

    // every column of one unpacked block: isum = sum_h sc_h * (sum(q * p) - 4 * sum(p))
    template <int RN, class V>
    static DFLASH_INLINE void columns(const K6PackedT<V> & w, const Activations<Q3_K> & a, int64_t b, int64_t j0,
                                      typename V::F * acc) {
        half_group_columns<Q3_K, 7, 2, RN, V>(w, a, b, j0, acc);
    }
};

// ---- Q2_K ----
// Group g = 4n + j (half n of the super-block, shift j) holds values 128n + 32j + l, l < 32: bits 2j, 2j + 1 of
// qs[32n + l]; value v has scale and min byte scales[v / 16], the scale in its low nibble, the min in its high one:
// w = d * sc_h * q - dmin * m_h. Q3_K's scheme (halves of 16) with q in 0..3, no offset, and a min per half whose
// term msum = sum_h m_h * sum(p) goes through Q4_K's float steps.

template <class V>
struct K2PackedT : K6PackedT<V> {
    typename V::I m_pair[GROUPS];   // mins of halves 2g, 2g + 1 as two int16, lanes = rows
};
using K2Packed = K2PackedT<V8>;

// Every width takes the transposed tile, as Q3_K
struct Q2_K : KTraits<block_q2_K, K2PackedT, 0>, FinishWithMin {
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, K2Packed & out) {
        using V = V8;
        using I = typename V::I;
        const TileRows<block_q2_K> r(t, b);
        for (int n = 0; n < 2; ++n) {
            I qs[TILE_ROWS];
            r.transposed(offsetof(block_q2_K, qs) + 32 * n, qs);
            for (int j = 0; j < 4; ++j) {
                for (int k = 0; k < TILE_ROWS; ++k) {
                    out.q[4 * n + j][k] = two_bits<V>(qs[k], j);
                }
            }
        }
        // byte h of the scales, lanes = rows: byte h % 4 of word h / 4
        I words[4];
        for (int w = 0; w < 4; ++w) {
            words[w] = r.lanes_u32(offsetof(block_q2_K, scales) + 4 * w);
        }
        I m[2 * GROUPS];
        for (int h = 0; h < 2 * GROUPS; ++h) {
            const I byte = lane_byte<V>(words[h / 4], h % 4);
            const I sc = V::and_(byte, V::set1(0xF));
            if (h % 2) {
                out.sc_hi[h / 2] = sc;
            } else {
                out.sc_lo[h / 2] = sc;
            }
            m[h] = V::srli32(byte, 4);
        }
        for (int g = 0; g < GROUPS; ++g) {
            out.m_pair[g] = pair16<V>(m[2 * g], m[2 * g + 1]);
        }
        // d, dmin: the two fp16 that close the block
        constexpr size_t d_at = sizeof(block_q2_K) - 2 * sizeof(ggml_half);
        out.rs = KRowScalesT<V>{r.lanes_f16(d_at), V::neg(r.lanes_f16(d_at + sizeof(ggml_half)))};
    }

    // every column of one unpacked block: isum = sum_h sc_h * sum(q * p), msum = sum_h m_h * sum(p)
    template <int RN, class V>
    static DFLASH_INLINE void columns(const K2PackedT<V> & w, const Activations<Q2_K> & a, int64_t b, int64_t j0,
                                      typename V::F * acc) {
        half_group_columns<Q2_K, 3, MIN_PER_HALF, RN, V>(w, a, b, j0, acc);
    }
};

// ---- Q8_K activations ----
// ggml quantizes the activations of every K-quant product with quantize_row_q8_K_ref (scalar on x86: ~3 % of a
// verify of the ~2B Q4_K_M shape). The same steps in vectors, bit for bit: amax the largest |x| (NaN never
// chosen), `max` the first x of that magnitude, iscale = -127 / max, each q the low byte of
// MIN(127, nearest_int(iscale * x)) with ggml's nearest_int (its 1.5 * 2^23 trick, not the CPU's rounding, so
// that non-finite input gives ggml's bytes too), d = 1 / iscale. An all-zero block gets d = 0, zero quants and
// zero bsums (ggml leaves its bsums as the buffer held them; d = 0 makes them count for nothing).

DFLASH_INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

void quantize_q8_k_block(const float * x, block_q8_K & y) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < QK_K; j += 8) {   // max_ps(a, m) keeps m where a is NaN
        m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), magnitude), m);
    }
    const float amax = hmax8(m);
    if (amax == 0.0f) {
        y.d = 0.0f;
        memset(y.qs, 0, sizeof y.qs);
        memset(y.bsums, 0, sizeof y.bsums);
        return;
    }
    float max = 0.0f;
    for (int j = 0; j < QK_K; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, magnitude), _mm256_set1_ps(amax), _CMP_EQ_OQ));
        if (hit != 0) {
            max = x[j + __builtin_ctz((unsigned) hit)];
            break;
        }
    }
    const float iscale = -127.f / max;
    const __m256 scale = _mm256_set1_ps(iscale);
    const __m256 magic = _mm256_set1_ps(12582912.f);
    const __m256i mantissa = _mm256_set1_epi32(0x007fffff), offset = _mm256_set1_epi32(0x00400000);
    const __m256i top = _mm256_set1_epi32(127), low_byte = _mm256_set1_epi32(0xFF);
    for (int j = 0; j < QK_K; j += 32) {
        __m256i v[4];
        for (int t = 0; t < 4; ++t) {
            const __m256 biased = _mm256_add_ps(_mm256_mul_ps(scale, _mm256_loadu_ps(x + j + 8 * t)), magic);
            const __m256i rounded = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(biased), mantissa), offset);
            v[t] = _mm256_and_si256(_mm256_min_epi32(rounded, top), low_byte);
        }
        // unsigned packs of values in 0..255 keep them as they are; the lane order is fixed by the permute
        const __m256i w01 = _mm256_packus_epi32(v[0], v[1]), w23 = _mm256_packus_epi32(v[2], v[3]);
        const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w01, w23),
                                                          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *) (y.qs + j), bytes);
    }
    for (int h = 0; h < QK_K / 16; ++h) {
        const __m128i q16 = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *) (y.qs + 16 * h)));
        const __m128i q16b = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *) (y.qs + 16 * h + 8)));
        __m128i s = _mm_madd_epi16(_mm_add_epi16(q16, q16b), _mm_set1_epi16(1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
        y.bsums[h] = (int16_t) _mm_cvtsi128_si32(s);
    }
    y.d = 1 / iscale;
}

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

bool full_rate_512(void) {
#if DFLASH_CPU_GEMM_V16
    // 8 independent chains of dot steps, 256-bit then 512-bit; a core that splits a 512-bit step in two takes twice
    // as long for the second (Zen 4: 2x), one with two 512-bit units about as long (Emerald Rapids: ~1x)
    constexpr int STEPS = 4096;
    const auto time_chains = [](auto zero) {
        using I = decltype(zero);
        I acc[8], u = zero, s = zero;
        double best = 1e30;
        for (int round = 0; round < 3; ++round) {
            // distinct starts: chains that start equal are one chain to the compiler (at -O3 it kept one
            // vpdpbusd of the eight, latency-bound at either width, so every AVX-512 core read as full rate)
            for (int j = 0; j < 8; ++j) {
                if constexpr (sizeof(I) == 64) {
                    acc[j] = _mm512_set1_epi32(j + 1);
                } else {
                    acc[j] = _mm256_set1_epi32(j + 1);
                }
            }
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < STEPS; ++i) {
                for (I & a : acc) {
                    if constexpr (sizeof(I) == 64) {
                        a = _mm512_dpbusd_epi32(a, u, s);
                    } else {
                        a = _mm256_dpbusd_epi32(a, u, s);
                    }
                }
                __asm__ volatile("" : "+v"(u));
            }
            __asm__ volatile("" ::"v"(acc[0]), "v"(acc[1]), "v"(acc[2]), "v"(acc[3]), "v"(acc[4]), "v"(acc[5]),
                             "v"(acc[6]), "v"(acc[7]));
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        return best;
    };
    // the best of interleaved rounds after a warm-up, so that neither a clock still rising nor a slow spell of a
    // shared machine decides (Zen 4 guest: 1.87)
    time_chains(_mm256_setzero_si256());
    time_chains(_mm512_setzero_si512());
    double t256 = 1e30, t512 = 1e30;
    for (int round = 0; round < 3; ++round) {
        t256 = std::min(t256, time_chains(_mm256_setzero_si256()));
        t512 = std::min(t512, time_chains(_mm512_setzero_si512()));
    }
    return t512 < 1.4 * t256;
#else
    return false;
#endif
}

bool quantize_q8_k(const float * x, void * y, int64_t k) {
#if DFLASH_CPU_GEMM_X86
    block_q8_K * out = (block_q8_K *) y;
    for (int64_t i = 0; i < k / QK_K; ++i) {
        quantize_q8_k_block(x + i * QK_K, out[i]);
    }
    return true;
#else
    (void) x; (void) y; (void) k;
    return false;
#endif
}

DFLASH_CPU_GEMM_ENTRY(gemm_q4_k, Q4_K)
DFLASH_CPU_GEMM_ENTRY(gemm_q5_k, Q5_K)
DFLASH_CPU_GEMM_ENTRY(gemm_q6_k, Q6_K)
DFLASH_CPU_GEMM_ENTRY(gemm_q3_k, Q3_K)
DFLASH_CPU_GEMM_ENTRY(gemm_q2_k, Q2_K)

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
