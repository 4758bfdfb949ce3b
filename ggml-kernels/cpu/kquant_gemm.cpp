// dflash-gguf: Q4_K, Q5_K and Q6_K weights x Q8_K activations (see tile_gemm.h).
//
// ggml's definitions (dequantize_row_q4_K / _q5_K / _q6_K), per super-block of 256 weights:
// - Q4_K / Q5_K: 8 groups of 32, w = d * sc_g * q - dmin * m_g with q in 0..15 (Q5_K: 0..31, the fifth
//   bit of group g in bit g of qh), sc_g and m_g 6-bit;
// - Q6_K: 16 halves of 16, w = d * sc_h * (q - 32) with q in 0..63, sc_h a signed byte.
// Q8_K activations: a = d_a * p, with the sums of p over each 16 (bsums).
// Per row, super-block and column two exact integers, as ggml's vec_dot sums them:
//   isum = sum_g sc_g * sum(q * p)       (Q6_K: sum_h sc_h * (sum(q * p) - 32 * sum(p)))
//   msum = sum_g m_g * sum(p)            (Q4_K / Q5_K)
// then the float steps (finish): acc += isum * (d * d_a), acc += msum * (-dmin * d_a). The transposed tile
// (lanes = rows) and the row-major path of one column get the same integers, so every batch width gives the
// same bits; a verify row equals the token decoded alone.

#include "tile_gemm.h"

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
struct KRowScales {
    __m256 d;
    __m256 neg_dmin;
};

template <bool MIN>
DFLASH_INLINE __m256 finish_k(__m256i isum, __m256i msum, const KRowScales & rs, const KScale & c, __m256 acc) {
    const __m256 da = _mm256_set1_ps(c.d);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(rs.d, da), acc);
    if (MIN) {
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(rs.neg_dmin, da), acc);
    }
    return acc;
}

// byte i of each 32-bit lane
DFLASH_INLINE __m256i lane_byte(__m256i v, int i) {
    return _mm256_and_si256(_mm256_srli_epi32(v, 8 * i), _mm256_set1_epi32(0xFF));
}

DFLASH_INLINE int32_t hsum_i32_128(__m128i x) {
    x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 1));
    return _mm_cvtsi128_si32(x);
}

DFLASH_INLINE int32_t hsum_i32(__m256i v) {
    return hsum_i32_128(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
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

// a group scale of each lane (int32, lanes = rows) as int16 in both halves of the lane, for AVX2's madd
DFLASH_INLINE __m256i pair16(__m256i sc) {
    return _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(sc, 16));
}

// isum + sc * sum over N groups of 4 of q * p, lanes = rows (see dot_groups): the scale times the exact dot
// (VNNI), or folded into AVX2's pair sums by madd with the scale as int16 (sc16, see pair16) -- the same integer
template <int MAX_Q, int N>
DFLASH_INLINE __m256i add_scaled_dot(__m256i isum, const __m256i * q, const int8_t * p, __m256i sc, __m256i sc16) {
#if DFLASH_CPU_GEMM_VNNI
    (void) sc16;
    return _mm256_add_epi32(isum, _mm256_mullo_epi32(dot_groups<MAX_Q, N>(q, p), sc));
#else
    (void) sc;
    constexpr int CHUNK = 32767 / (2 * MAX_Q * 128) < N ? 32767 / (2 * MAX_Q * 128) : N;
    for (int k0 = 0; k0 < N; k0 += CHUNK) {
        __m256i s16 = _mm256_maddubs_epi16(q[k0], _mm256_set1_epi32((int) load_u32(p + 4 * k0)));
        for (int k = k0 + 1; k < k0 + CHUNK && k < N; ++k) {
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[k], _mm256_set1_epi32((int) load_u32(p + 4 * k))));
        }
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s16, sc16));
    }
    return isum;
#endif
}

// Groups of 4 weight quants per scaled dot step in Format::columns: a whole group of 32 where VNNI's registers
// hold it beside RN accumulators, half of one with AVX2's 16 registers
#if DFLASH_CPU_GEMM_VNNI && defined(__AVX512F__)
constexpr int STEP_GROUPS = 8;
#else
constexpr int STEP_GROUPS = 4;
#endif

// ---- Q4_K and Q5_K ----

struct K4Packed {
    __m256i q[GROUPS][8];   // transposed quants of each group (see PackedBlock)
    __m256i sc[GROUPS];     // 6-bit scales, lanes = rows
    __m256i m_pair[GROUPS / 2];   // 6-bit mins of groups 2k, 2k + 1 as two int16
    KRowScales rs;
};

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

template <typename Row>
DFLASH_INLINE KRowScales k_row_scales(const Row * (&r)[TILE_ROWS]) {
    return KRowScales{load_lanes_f16(r, 0), _mm256_sub_ps(_mm256_setzero_ps(), load_lanes_f16(r, sizeof(ggml_half)))};
}

// The same, lanes = rows, for the transposed tile
template <typename Row>
DFLASH_INLINE void unpack_scales_mins(const Row * (&r)[TILE_ROWS], K4Packed & out) {
    const size_t at = offsetof(Row, scales);
    const __m256i a0 = load_lanes_u32(r, at);       // scales[0..3]: sc_0..3 (low 6 bits), high bits of sc_4..7
    const __m256i a1 = load_lanes_u32(r, at + 4);   // scales[4..7]: m_0..3, high bits of m_4..7
    const __m256i a2 = load_lanes_u32(r, at + 8);   // scales[8..11]: low 4 bits of sc_4..7 and m_4..7
    const __m256i six = _mm256_set1_epi32(63);
    const __m256i four = _mm256_set1_epi32(15);
    __m256i m[GROUPS];
    for (int g = 0; g < 4; ++g) {
        const __m256i b2 = lane_byte(a2, g);
        out.sc[g] = _mm256_and_si256(lane_byte(a0, g), six);
        m[g] = _mm256_and_si256(lane_byte(a1, g), six);
        out.sc[g + 4] = _mm256_or_si256(_mm256_and_si256(b2, four),
                                        _mm256_slli_epi32(_mm256_srli_epi32(lane_byte(a0, g), 6), 4));
        m[g + 4] = _mm256_or_si256(_mm256_srli_epi32(b2, 4),
                                   _mm256_slli_epi32(_mm256_srli_epi32(lane_byte(a1, g), 6), 4));
    }
    for (int k = 0; k < GROUPS / 2; ++k) {
        out.m_pair[k] = _mm256_or_si256(m[2 * k], _mm256_slli_epi32(m[2 * k + 1], 16));
    }
    out.rs = k_row_scales(r);
}

// The 4-bit quants of Q4_K / Q5_K rows: 32 bytes per pair of groups, group 2c in the low nibbles of
// bytes 32c.., group 2c + 1 in the high ones
template <typename Row>
DFLASH_INLINE void unpack_low_nibbles(const Row * (&r)[TILE_ROWS], K4Packed & out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < GROUPS / 2; ++c) {
        __m256i g[TILE_ROWS];
        load_transposed(r, offsetof(Row, qs) + 32 * c, g);
        for (int k = 0; k < TILE_ROWS; ++k) {
            out.q[2 * c][k] = _mm256_and_si256(g[k], low4);
            out.q[2 * c + 1][k] = _mm256_and_si256(_mm256_srli_epi16(g[k], 4), low4);
        }
    }
}

// bit g of each byte moved to bit 4 (16-bit shifts: bits crossing bytes land outside bit 4)
DFLASH_INLINE __m256i fifth_bit(__m256i h, int g) {
    const __m256i moved = g < 4 ? _mm256_slli_epi16(h, 4 - g) : _mm256_srli_epi16(h, g - 4);
    return _mm256_and_si256(moved, _mm256_set1_epi8(0x10));
}

// What the K-quant formats share: Q8_K activations, the transposed tile, the row-major path up to ROWS columns
template <typename WeightBlock, typename PackedBlocks, int64_t ROWS>
struct KTraits {
    using Block = WeightBlock;
    using ActBlock = block_q8_K;
    using Scale = KScale;
    using Packed = PackedBlocks;
    using RowScales = KRowScales;
    static constexpr bool TILED = true;
    static constexpr bool ROW_MAJOR = true;
    static constexpr int64_t ROWWISE_MAX = ROWS;

    static KScale column_scale(const block_q8_K & y) { return q8_k_column_scale(y); }
};

// measured (lab/cpu_matmul_cost.py): row-major wins up to 3 columns of Q4_K / Q5_K
template <class Self, typename WeightBlock, int QMAX>
struct K4Format : KTraits<WeightBlock, K4Packed, 3> {
    using Block = WeightBlock;
    static DFLASH_INLINE KRowScales row_scales(const Block * (&r)[TILE_ROWS]) { return k_row_scales(r); }
    static DFLASH_INLINE __m256 finish(__m256i isum, __m256i msum, const KRowScales & rs, const KScale & c, __m256 acc) {
        return finish_k<true>(isum, msum, rs, c, acc);
    }

    // every column of one unpacked block: each part of a group's quants stays in registers for all RN columns
    template <int RN>
    static DFLASH_INLINE void columns(const K4Packed & w, const Activations<Self> & a, int64_t b, int64_t j0,
                                      __m256 * acc) {
        const int8_t * p[RN];
        __m256i isum[RN];
        for (int j = 0; j < RN; ++j) {
            p[j] = a.quants(b, j0 + j);
            isum[j] = _mm256_setzero_si256();
        }
        for (int g = 0; g < GROUPS; ++g) {
            const __m256i sc16 = pair16(w.sc[g]);
            for (int k = 0; k < 8; k += STEP_GROUPS) {
                for (int j = 0; j < RN; ++j) {
                    isum[j] = add_scaled_dot<QMAX, STEP_GROUPS>(isum[j], w.q[g] + k, p[j] + 32 * g + 4 * k, w.sc[g], sc16);
                }
            }
        }
        for (int j = 0; j < RN; ++j) {
            const KScale & c = *a.scales(b, j0 + j);
            __m256i msum = _mm256_setzero_si256();
            for (int k = 0; k < GROUPS / 2; ++k) {
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(w.m_pair[k], _mm256_set1_epi32((int) load_u32(c.s16 + 2 * k))));
            }
            acc[j] = finish(isum[j], msum, w.rs, c, acc[j]);
        }
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
        const block_q4_K * r[TILE_ROWS];
        t.rows(b, r);
        unpack_low_nibbles(r, out);
        unpack_scales_mins(r, out);
    }
    static DFLASH_INLINE void add_fifth_bits(const block_q4_K &, int, __m256i &, __m256i &) {}
};

struct Q5_K : K4Format<Q5_K, block_q5_K, 31> {
    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, K4Packed & out) {
        const block_q5_K * r[TILE_ROWS];
        t.rows(b, r);
        unpack_low_nibbles(r, out);
        // value l of group g (byte l of the group's 32) takes bit g of qh[l]; transposed, lane byte j of
        // h[k] is qh[4k + j], the same positions as the group's q[k]
        __m256i h[TILE_ROWS];
        load_transposed(r, offsetof(block_q5_K, qh), h);
        for (int g = 0; g < GROUPS; ++g) {
            for (int k = 0; k < TILE_ROWS; ++k) {
                out.q[g][k] = _mm256_or_si256(out.q[g][k], fifth_bit(h[k], g));
            }
        }
        unpack_scales_mins(r, out);
    }
    // the fifth bits of groups g and g + 1 (bits g, g + 1 of qh[l]) into a row's quants
    static DFLASH_INLINE void add_fifth_bits(const block_q5_K & x, int g, __m256i & lo, __m256i & hi) {
        const __m256i h = _mm256_loadu_si256((const __m256i *) x.qh);
        lo = _mm256_or_si256(lo, fifth_bit(h, g));
        hi = _mm256_or_si256(hi, fifth_bit(h, g + 1));
    }
};

// ---- Q6_K ----
// Group g = 4n + t (half n of the super-block, quarter t) holds values 128n + 32t + l, l < 32: the low 4 bits
// from ql[64n + 32 (t % 2) + l] (low nibble for t < 2, high for t >= 2), the high 2 from bits 2t, 2t + 1 of
// qh[32n + l]; value v has scale sc[v / 16].

struct K6Packed {
    __m256i q[GROUPS][8];     // transposed: q[g][0..3] the group's first 16 values, q[g][4..7] its second 16
    __m256i sc_lo[GROUPS];    // scale of the first 16, lanes = rows
    __m256i sc_hi[GROUPS];    // of the second 16
    KRowScales rs;
};

// the 6-bit quants of group 4n + t from its low-bits bytes l and high-bits bytes h (either layout)
DFLASH_INLINE __m256i q6_group(__m256i l, __m256i h, int t) {
    const __m256i lo = t >= 2 ? _mm256_and_si256(_mm256_srli_epi16(l, 4), _mm256_set1_epi8(0x0F))
                              : _mm256_and_si256(l, _mm256_set1_epi8(0x0F));
    // bits 2t, 2t + 1 of each byte to bits 4, 5
    const __m256i hi = t < 2 ? _mm256_slli_epi16(h, 4 - 2 * t) : t == 2 ? h : _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
}

// measured: up to 4 columns of Q6_K, whose transposed unpack (6-bit quants from two places) costs more
struct Q6_K : KTraits<block_q6_K, K6Packed, 4> {
    static DFLASH_INLINE KRowScales row_scales(const block_q6_K * (&r)[TILE_ROWS]) {
        return KRowScales{load_lanes_f16(r, offsetof(block_q6_K, d)), _mm256_setzero_ps()};
    }
    static DFLASH_INLINE __m256 finish(__m256i isum, __m256i msum, const KRowScales & rs, const KScale & c, __m256 acc) {
        return finish_k<false>(isum, msum, rs, c, acc);
    }

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, K6Packed & out) {
        const block_q6_K * r[TILE_ROWS];
        t.rows(b, r);
        for (int n = 0; n < 2; ++n) {
            __m256i h[TILE_ROWS];
            load_transposed(r, offsetof(block_q6_K, qh) + 32 * n, h);
            for (int half = 0; half < 2; ++half) {
                __m256i l[TILE_ROWS];
                load_transposed(r, offsetof(block_q6_K, ql) + 64 * n + 32 * half, l);
                for (int nib = 0; nib < 2; ++nib) {
                    const int tq = 2 * nib + half;
                    for (int k = 0; k < TILE_ROWS; ++k) {
                        out.q[4 * n + tq][k] = q6_group(l[k], h[k], tq);
                    }
                }
            }
        }
        // sc[j] signed bytes, lanes = rows: byte j % 4 of word j / 4, sign-extended
        __m256i words[4];
        for (int w = 0; w < 4; ++w) {
            words[w] = load_lanes_u32(r, offsetof(block_q6_K, scales) + 4 * w);
        }
        for (int g = 0; g < GROUPS; ++g) {
            const int j = 2 * g;   // scales j, j + 1: the same word (j % 4 is 0 or 2)
            out.sc_lo[g] = _mm256_srai_epi32(_mm256_slli_epi32(words[j / 4], 24 - 8 * (j % 4)), 24);
            out.sc_hi[g] = _mm256_srai_epi32(_mm256_slli_epi32(words[j / 4], 16 - 8 * (j % 4)), 24);
        }
        out.rs = row_scales(r);
    }

    // every column of one unpacked block, each half-group's quants in registers for all RN columns:
    // isum = sum_h sc_h * sum(q * p) - 32 * sum_h sc_h * sum(p), the offset term by int16 pairs of scales
    template <int RN>
    static DFLASH_INLINE void columns(const K6Packed & w, const Activations<Q6_K> & a, int64_t b, int64_t j0,
                                      __m256 * acc) {
        const int8_t * p[RN];
        __m256i isum[RN];
        for (int j = 0; j < RN; ++j) {
            p[j] = a.quants(b, j0 + j);
            isum[j] = _mm256_setzero_si256();
        }
        for (int g = 0; g < GROUPS; ++g) {
            for (int half = 0; half < 2; ++half) {
                const __m256i sc = half ? w.sc_hi[g] : w.sc_lo[g];
                const __m256i sc16 = pair16(sc);
                for (int j = 0; j < RN; ++j) {
                    isum[j] = add_scaled_dot<63, 4>(isum[j], w.q[g] + 4 * half, p[j] + 32 * g + 16 * half, sc, sc16);
                }
            }
        }
        __m256i sc_pair[GROUPS];   // scales of halves 2g, 2g + 1 as two int16
        for (int g = 0; g < GROUPS; ++g) {
            sc_pair[g] = _mm256_or_si256(_mm256_and_si256(w.sc_lo[g], _mm256_set1_epi32(0xFFFF)),
                                         _mm256_slli_epi32(w.sc_hi[g], 16));
        }
        for (int j = 0; j < RN; ++j) {
            const KScale & c = *a.scales(b, j0 + j);
            __m256i offset = _mm256_setzero_si256();
            for (int g = 0; g < GROUPS; ++g) {
                offset = _mm256_add_epi32(offset, _mm256_madd_epi16(sc_pair[g], _mm256_set1_epi32((int) load_u32(c.bsums + 2 * g))));
            }
            acc[j] = finish(_mm256_sub_epi32(isum[j], _mm256_slli_epi32(offset, 5)), _mm256_setzero_si256(), w.rs, c,
                            acc[j]);
        }
    }

    template <int RN>
    static DFLASH_INLINE void row_sums(const block_q6_K & x, const int8_t * const (&p)[RN], const KScale * const (&c)[RN],
                                       int32_t (&isum)[RN], int32_t (&msum)[RN]) {
        __m256i acc[RN];
        for (int j = 0; j < RN; ++j) {
            acc[j] = _mm256_setzero_si256();
        }
        const __m128i scales8 = _mm_loadu_si128((const __m128i *) x.scales);
        for (int n = 0; n < 2; ++n) {
            const __m256i h = _mm256_loadu_si256((const __m256i *) (x.qh + 32 * n));
            for (int half = 0; half < 2; ++half) {
                const __m256i l = _mm256_loadu_si256((const __m256i *) (x.ql + 64 * n + 32 * half));
                for (int nib = 0; nib < 2; ++nib) {
                    const int tq = 2 * nib + half;
                    const int g = 4 * n + tq;
                    const __m256i q = q6_group(l, h, tq);
                    // [sc_2g x 4, sc_2g+1 x 4] as int32; [sc_2g x 8, sc_2g+1 x 8] as int16
                    const __m128i pick = _mm_setr_epi8(2 * g, 2 * g, 2 * g, 2 * g, 2 * g + 1, 2 * g + 1, 2 * g + 1,
                                                       2 * g + 1, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g + 1, 2 * g + 1,
                                                       2 * g + 1, 2 * g + 1);
                    const __m128i two = _mm_shuffle_epi8(scales8, pick);
                    const __m256i sc32 = _mm256_cvtepi8_epi32(two);
                    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi32(two, two));
                    for (int j = 0; j < RN; ++j) {
                        acc[j] = _mm256_add_epi32(acc[j], scaled_dot32(q, p[j] + 32 * g, sc32, sc16));
                    }
                }
            }
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(scales8);
        for (int j = 0; j < RN; ++j) {   // minus sum_h sc_h * 32 * sum(p) over half h
            const __m256i bias = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *) c[j]->bsums));
            isum[j] = hsum_i32(acc[j]) - 32 * hsum_i32(bias);
            msum[j] = 0;
        }
    }
};

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

DFLASH_CPU_GEMM_ENTRY(gemm_q4_k, Q4_K)
DFLASH_CPU_GEMM_ENTRY(gemm_q5_k, Q5_K)
DFLASH_CPU_GEMM_ENTRY(gemm_q6_k, Q6_K)

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
