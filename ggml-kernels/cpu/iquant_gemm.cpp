// dflash-gguf: IQ4_XS and the lattice formats IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M weights x Q8_K
// activations
// (see tile_gemm.h, kquant.h).
//
// All hold, per super-block of 256 weights, 8 groups of 32 signed values v scaled per group by an integer:
//   w = d * sc_g * v      (IQ3_XXS: w = d / 4 * sc_g * v; the IQ2 and IQ1 types: d / 8, IQ2_XS, IQ2_S and IQ1_M a scale
//   per 16; IQ1_S and IQ1_M: v = 8 point +- 1)
// Per row, super-block and column one exact integer isum = sum_g sc_g * sum(v * p), then one float step:
// acc += isum * (d * d_a). The transposed tile (lanes = rows) keeps with VNNI v + 128 for its unsigned x signed steps
// and subtracts 128 * sum_g sc_g * sum(p); without VNNI (v + 128 would overflow AVX2's int16 pairs) |v| and v's
// sign, maddubs(|v|, sign(p, v)). The same integers at every width: a verify row equals the token decoded alone.

#define GGML_COMMON_IMPL_CPP   // ggml's grids and sign tables (ggml-common.h), read by the lattice formats
#include "kquant.h"

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

namespace {

// A transposed block of signed values, lanes = rows: with VNNI q[g][k] the group's values 4k..4k+3 plus 128 and
// m_pair the scales of groups 2k, 2k + 1 as two int16 (for the 128 * sum(p) term); without, q the values'
// magnitudes and v their signs (any byte of the value's sign: sign(p, v) takes only that)
#if DFLASH_CPU_GEMM_VNNI
template <class V>
using SignedPackedT = K4PackedT<V>;
#else
template <class V>
struct SignedPackedT : K4PackedT<V> {
    typename V::I v[GROUPS][8];
};
#endif

// The same for formats with a scale per 16 values (IQ2_XS, IQ2_S): sc holds each group's first, sc_hi its second
template <class V>
struct HalvesPackedT : SignedPackedT<V> {
    typename V::I sc_hi[GROUPS];
#if DFLASH_CPU_GEMM_VNNI
    typename V::I half_pair[GROUPS];   // sc[g], sc_hi[g] as two int16, against Q8_K's sums of 16
#endif
};

template <bool HALVES>
struct SignedPacked {
    template <class V>
    using T = std::conditional_t<HALVES, HalvesPackedT<V>, SignedPackedT<V>>;
};

// What the formats of signed values share: the transposed tile's parts and its column steps. Self::unpack fills
// the integer scales (sc, and sc_hi with HALVES) and each part through lane_signed_values or lane_lattice_values,
// then finish_unpack.
template <class Self, typename WeightBlock, int64_t ROWWISE, bool HALVES = false>
struct SignedGroups : KTraits<WeightBlock, SignedPacked<HALVES>::template T, ROWWISE>, FinishWithoutMin<WeightBlock> {
    template <class V>
    using PackedV = typename SignedPacked<HALVES>::template T<V>;
    using Packed = PackedV<V8>;
    using Finish = FinishWithoutMin<WeightBlock>;

    // part k of group g from signed values v (|v| <= 127)
    static DFLASH_INLINE void lane_signed_values(Packed & out, int g, int k, __m256i v) {
#if DFLASH_CPU_GEMM_VNNI
        out.q[g][k] = _mm256_xor_si256(v, _mm256_set1_epi8((char) 0x80));
#else
        out.q[g][k] = _mm256_abs_epi8(v);
        out.v[g][k] = v;
#endif
    }

    // part k of group g from magnitudes (a lattice point's bytes, 1..127) and the bytes that are negative (0xFF)
    static DFLASH_INLINE void lane_lattice_values(Packed & out, int g, int k, __m256i magnitude, __m256i negative) {
#if DFLASH_CPU_GEMM_VNNI
        const __m256i v = _mm256_sub_epi8(_mm256_xor_si256(magnitude, negative), negative);
        out.q[g][k] = _mm256_xor_si256(v, _mm256_set1_epi8((char) 0x80));
#else
        out.q[g][k] = magnitude;
        out.v[g][k] = _mm256_or_si256(negative, _mm256_set1_epi8(1));
#endif
    }

    // the rows' d (lanes; times D_SCALE, as finish_row takes it) and, with VNNI, the v + 128 term's scale pairs
    static DFLASH_INLINE void finish_unpack(Packed & out, __m256 d) {
        using V = V8;
#if DFLASH_CPU_GEMM_VNNI
        if constexpr (HALVES) {
            for (int g = 0; g < GROUPS; ++g) {
                out.half_pair[g] = pair16<V>(out.sc[g], out.sc_hi[g]);
            }
        } else {
            for (int k = 0; k < GROUPS / 2; ++k) {
                out.m_pair[k] = pair16<V>(out.sc[2 * k], out.sc[2 * k + 1]);
            }
        }
#endif
        out.rs = KRowScalesT<V>{Self::D_SCALE == 1.0f ? d : V::mul(d, V::set1f(Self::D_SCALE)), V::zerof()};
    }

    // One column row-major: per group Self::row_group gives one row's 32 magnitudes in order, their signs and the
    // scale(s) as int16 pairs, stepped as maddubs(|v|, sign(p, v)) on every ISA: the tile's integers, in another order
    template <int RN>
    static DFLASH_INLINE void row_sums(const WeightBlock & x, const int8_t * const (&p)[RN], const KScale * const (&)[RN],
                                       int32_t (&isum)[RN], int32_t (&msum)[RN]) {
        __m256i acc[RN];
        for (int j = 0; j < RN; ++j) {
            acc[j] = _mm256_setzero_si256();
        }
        for (int g = 0; g < GROUPS; ++g) {
            __m256i magnitude, sign, sc16;
            Self::row_group(x, g, magnitude, sign, sc16);
            for (int j = 0; j < RN; ++j) {
                const __m256i pv = _mm256_loadu_si256((const __m256i *) (p[j] + 32 * g));
                const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(pv, sign));
                acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(pairs, sc16));
            }
        }
        for (int j = 0; j < RN; ++j) {
            isum[j] = hsum_i32(acc[j]);
            msum[j] = 0;
        }
    }

    // finish() of one row: the same float operations on the same values as its lane, (d * D_SCALE) * d_a included
    static DFLASH_INLINE float finish_row(const WeightBlock & x, int32_t isum, int32_t, const KScale & c, float acc) {
        return std::fma((float) isum, (_cvtsh_ss(x.d) * Self::D_SCALE) * c.d, acc);
    }

    template <int RN, class V>
    static DFLASH_INLINE void columns(const PackedV<V> & w, const Activations<Self> & a, int64_t b, int64_t j0,
                                      typename V::F * acc) {
        const int8_t * p[RN];
        typename V::I isum[RN];
        start_columns<V>(a, b, j0, p, isum);
#if DFLASH_CPU_GEMM_VNNI
        for (int g = 0; g < GROUPS; ++g) {
            if constexpr (HALVES) {
                add_scaled_dots<RN, 4, 255, V>(isum, w.q[g], p, 32 * g, w.sc[g], w.sc[g]);
                add_scaled_dots<RN, 4, 255, V>(isum, w.q[g] + 4, p, 32 * g + 16, w.sc_hi[g], w.sc_hi[g]);
            } else {
                add_scaled_dots<RN, 8, 255, V>(isum, w.q[g], p, 32 * g, w.sc[g], w.sc[g]);
            }
        }
        for (int j = 0; j < RN; ++j) {
            const KScale & c = *a.scales(b, j0 + j);
            typename V::I offset;   // / 128 of the v + 128 term
            if constexpr (HALVES) {
                offset = V::zero();
                for (int g = 0; g < GROUPS; ++g) {
                    offset = V::add(offset, V::madd16(w.half_pair[g], V::set1((int) load_u32(c.bsums + 2 * g))));
                }
            } else {
                offset = group_sums_times<V>(w.m_pair, c);
            }
            acc[j] = Finish::template finish<V>(V::sub(isum[j], V::template slli<7>(offset)), V::zero(), w.rs, c, acc[j]);
        }
#else
        // column after column, as add_scaled_dots: each dot step's pairs |v| * (+-p) fill int16 (2 * 127 * 127), so
        // every step is scaled and widened by its own madd
        __m256i sc16[GROUPS][2];   // each group's scale (of each 16) as int16 in both halves of a lane
        for (int g = 0; g < GROUPS; ++g) {
            sc16[g][0] = pair16<V>(w.sc[g], w.sc[g]);
            if constexpr (HALVES) {
                sc16[g][1] = pair16<V>(w.sc_hi[g], w.sc_hi[g]);
            } else {
                sc16[g][1] = sc16[g][0];
            }
        }
        for (int j = 0; j < RN; ++j) {
            for (int g = 0; g < GROUPS; ++g) {
                for (int k = 0; k < 8; ++k) {
                    const __m256i pk = _mm256_set1_epi32((int) load_u32(p[j] + 32 * g + 4 * k));
                    const __m256i pairs = _mm256_maddubs_epi16(w.q[g][k], _mm256_sign_epi8(pk, w.v[g][k]));
                    isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(pairs, sc16[g][k / 4]));
                }
            }
            acc[j] = Finish::template finish<V>(isum[j], V::zero(), w.rs, *a.scales(b, j0 + j), acc[j]);
        }
#endif
    }
};

// ---- IQ4_XS ----
// ggml's dequantize_row_iq4_xs: w = d * (ls_g - 32) * kvalues_iq4nl[q] with q a nibble (group g: bytes 16g..16g+15 of
// qs, low nibbles its values 0..15, high ones 16..31, as IQ4_NL) and ls_g six bits: the low four in nibble g of
// scales_l, the high two in bits 2g, 2g + 1 of scales_h (|isum| < 2^28). One column row-major takes
// maddubs(|v|, sign(p, v)) on every ISA.

DFLASH_INLINE __m256i iq4_values(__m256i nibbles) {
    const __m256i table = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                           -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    return _mm256_shuffle_epi8(table, nibbles);
}

// ls_g - 32 of one row's super-block
DFLASH_INLINE int iq4_xs_scale(const block_iq4_xs & x, int g) {
    const int low = (x.scales_l[g / 2] >> (4 * (g % 2))) & 0xF;
    const int high = (x.scales_h >> (2 * g)) & 3;
    return (low | (high << 4)) - 32;
}

// One column row-major (ggml's layout; the transposed tile from 2)
constexpr int64_t IQ4_XS_ROWWISE_MAX = 1;

struct IQ4_XS : SignedGroups<IQ4_XS, block_iq4_xs, IQ4_XS_ROWWISE_MAX> {
    static constexpr float D_SCALE = 1.0f;

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, Packed & out) {
        using V = V8;
        const TileRows<block_iq4_xs> r(t, b);
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        for (int g = 0; g < GROUPS; ++g) {
            __m256i n[4];
            load_transposed16(r.r, offsetof(block_iq4_xs, qs) + 16 * g, n);
            for (int k = 0; k < 4; ++k) {
                lane_signed_values(out, g, k, iq4_values(_mm256_and_si256(n[k], low4)));
                lane_signed_values(out, g, k + 4, iq4_values(_mm256_and_si256(_mm256_srli_epi16(n[k], 4), low4)));
            }
        }
        const __m256i head = r.lanes_u32(0);                                        // d, scales_h
        const __m256i low = r.lanes_u32(offsetof(block_iq4_xs, scales_l));         // nibble g: low bits of ls_g
        for (int g = 0; g < GROUPS; ++g) {
            const __m256i lo4 = V::and_(V::srli32(low, 4 * g), V::set1(0xF));
            const __m256i hi2 = V::and_(V::srli32(head, 16 + 2 * g), V::set1(3));
            out.sc[g] = V::sub(V::or_(lo4, V::slli32(hi2, 4)), V::set1(32));
        }
        finish_unpack(out, r.lanes_f16(0));
    }

    static DFLASH_INLINE void row_group(const block_iq4_xs & x, int g, __m256i & magnitude, __m256i & sign,
                                        __m256i & sc16) {
        sign = iq4_values(nibbles_in_order(x.qs + 16 * g));
        magnitude = _mm256_abs_epi8(sign);
        sc16 = _mm256_set1_epi16((short) iq4_xs_scale(x, g));
    }
};

// ---- The lattice formats: IQ3_XXS and IQ3_S (and what the IQ2 types share with them) ----
// Each 4 weights of a group are one point of a grid of unsigned bytes (ggml's iq3xxs_grid, iq3s_grid), indexed per
// row; a tile's 8 rows take their points with one gather. Every weight has a sign bit: IQ3_S stores them, IQ3_XXS
// stores 7 per 8 weights (ggml's ksigns_iq2xs: the eighth makes their count even). Matrices whose rows are a multiple
// of 8 are interleaved at load and read in lanes at every width (gemm.h). In ggml's layout one column takes the
// transposed tile too, but for IQ3_S: a row's values are one gather and its stored signs one shuffle, so row by row is
// cheaper there; where the signs come from ksigns (IQ3_XXS, IQ2_XXS, IQ2_XS) or the points are 8 values (IQ2_S), sign work
// shared by 8 rows costs less (one thread, 2048 x 2048, the two paths alternated by process, best of 4 rounds,
// AVX-512 / AVX2, row-major over transposed: IQ3_S 0.87 / 0.95, IQ3_XXS 1.05 / 1.27, IQ2_XXS 1.31 / 1.35, IQ2_XS
// 0.93 / 1.20, IQ2_S 1.25 / 0.96).

// byte 0 of each lane (its signs of 8 values) as 4 byte masks: 0xFF where the value's bit is set, values 4h..4h+3
DFLASH_INLINE __m256i negative_bytes(__m256i signs8, int h) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                            0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i bit = h == 0 ? _mm256_set1_epi32(0x08040201) : _mm256_set1_epi32((int) 0x80402010);
    return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(signs8, spread), bit), bit);
}

// ksigns_iq2xs of 7 sign bits per lane: bit 7 set where the seven have an odd count
DFLASH_INLINE __m256i with_parity_bit(__m256i s7) {
    __m256i x = _mm256_xor_si256(s7, _mm256_srli_epi32(s7, 4));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 2));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 1));
    return _mm256_or_si256(s7, _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(1)), 7));
}

// ksigns_iq2xs of the 7-bit sign field m (bits 7m..7m+6) of each lane's word (IQ3_XXS, IQ2_XXS)
DFLASH_INLINE __m256i sign_field(__m256i word, int m) {
    return with_parity_bit(_mm256_and_si256(_mm256_srli_epi32(word, 7 * m), _mm256_set1_epi32(127)));
}

// 2 ls + 1 of each lane's ls: the integer group scales of the lattice types
DFLASH_INLINE __m256i odd_scales(__m256i ls) {
    return _mm256_add_epi32(_mm256_slli_epi32(ls, 1), _mm256_set1_epi32(1));
}

// the grid points of 8 rows, lanes = rows
DFLASH_INLINE __m256i gather_points(const uint32_t * grid, __m256i index) {
    return _mm256_i32gather_epi32((const int *) grid, index, 4);
}

// one row's 32 sign bits (bit j: value j) as the sign bytes row_sums takes: -1 where set, 1 elsewhere
DFLASH_INLINE __m256i row_signs(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long) 0x8040201008040201ULL);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int) bits), spread);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(1));
}

// one row's 8 grid indices (bytes) as 32-bit lanes
DFLASH_INLINE __m256i row_indices(const uint8_t * qs) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) qs));
}

// ggml's dequantize_row_iq3_xxs: group g's 8 grid indices in qs[8g..8g+7] (index i: values 4i..4i+3), then per group
// a 32-bit word at qs[64 + 4g]: 7 sign bits of values 8m..8m+7 at bit 7m (m < 4), ls_g in the top 4 bits;
// w = d * (0.5 + ls_g) * 0.5 * point * sign = d / 4 * (2 ls_g + 1) * point * sign, points in 4..62
struct IQ3_XXS : SignedGroups<IQ3_XXS, block_iq3_xxs, 0> {
    static constexpr float D_SCALE = 0.25f;   // of d in every float step (w = d * D_SCALE * sc * v)

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, Packed & out) {
        using V = V8;
        const TileRows<block_iq3_xxs> r(t, b);
        constexpr size_t QS = offsetof(block_iq3_xxs, qs);
        for (int g = 0; g < GROUPS; ++g) {
            const __m256i word = r.lanes_u32(QS + QK_K / 4 + 4 * g);
            out.sc[g] = odd_scales(V::srli32(word, 28));
            for (int half = 0; half < 2; ++half) {
                const __m256i indices = r.lanes_u32(QS + 8 * g + 4 * half);
                for (int m = 2 * half; m < 2 * half + 2; ++m) {
                    const __m256i signs = sign_field(word, m);
                    for (int h = 0; h < 2; ++h) {
                        const int i = 2 * m + h;
                        lane_lattice_values(out, g, i, gather_points(iq3xxs_grid, lane_byte<V>(indices, i % 4)),
                                            negative_bytes(signs, h));
                    }
                }
            }
        }
        finish_unpack(out, r.lanes_f16(0));
    }
};

// ggml's dequantize_row_iq3_s: group g's 8 grid indices in qs[8g..8g+7] with their ninth bits in qh[g] (bit i for
// index i), the signs of values 8m..8m+7 in signs[4g + m], ls_g in nibble g of scales;
// w = d * (1 + 2 ls_g) * point * sign, points in 1..15
struct IQ3_S : SignedGroups<IQ3_S, block_iq3_s, 1> {
    static constexpr float D_SCALE = 1.0f;   // of d in every float step (w = d * D_SCALE * sc * v)

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, Packed & out) {
        using V = V8;
        const TileRows<block_iq3_s> r(t, b);
        const __m256i scales = r.lanes_u32(offsetof(block_iq3_s, scales));
        for (int g = 0; g < GROUPS; ++g) {
            out.sc[g] = odd_scales(V::and_(V::srli32(scales, 4 * g), V::set1(15)));
            const __m256i high = lane_byte<V>(r.lanes_u32(offsetof(block_iq3_s, qh) + 4 * (g / 4)), g % 4);
            const __m256i signs = r.lanes_u32(offsetof(block_iq3_s, signs) + 4 * g);
            for (int half = 0; half < 2; ++half) {
                const __m256i indices = r.lanes_u32(offsetof(block_iq3_s, qs) + 8 * g + 4 * half);
                for (int j = 0; j < 4; ++j) {
                    const int i = 4 * half + j;
                    const __m256i ninth = V::slli32(V::and_(V::srli32(high, i), V::set1(1)), 8);
                    lane_lattice_values(out, g, i, gather_points(iq3s_grid, V::or_(lane_byte<V>(indices, j), ninth)),
                                        negative_bytes(lane_byte<V>(signs, i / 2), i % 2));
                }
            }
        }
        finish_unpack(out, r.lanes_f16(0));
    }

    static DFLASH_INLINE void row_group(const block_iq3_s & x, int g, __m256i & magnitude, __m256i & sign,
                                        __m256i & sc16) {
        const __m256i bit_i = _mm256_srlv_epi32(_mm256_set1_epi32(x.qh[g]), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256i ninth = _mm256_slli_epi32(_mm256_and_si256(bit_i, _mm256_set1_epi32(1)), 8);
        magnitude = gather_points(iq3s_grid, _mm256_or_si256(row_indices(x.qs + 8 * g), ninth));
        sign = row_signs(load_u32(x.signs + 4 * g));
        sc16 = _mm256_set1_epi16((short) (2 * ((x.scales[g / 2] >> (4 * (g % 2))) & 15) + 1));
    }
};

// ---- IQ2_XXS, IQ2_XS, IQ2_S ----
// Grid points of 8 values (ggml's iq2xxs_grid, iq2xs_grid, iq2s_grid: bytes 8, 25, 43), read as two 4-byte halves:
// point n's values 4h..4h+3 are the 32-bit word 2n + h. w = d * (0.5 + ls) * 0.25 * point * sign
// = d / 8 * (2 ls + 1) * point * sign, one ls per group of 32 (IQ2_XXS) or per 16 (IQ2_XS, IQ2_S).

// the half h of 8 rows' grid points n (lanes)
DFLASH_INLINE __m256i gather_half_points(const uint64_t * grid, __m256i n, int h) {
    return gather_points((const uint32_t *) grid, _mm256_add_epi32(_mm256_slli_epi32(n, 1), _mm256_set1_epi32(h)));
}

// 2 ls + 1 of the low (high) nibble of byte i of each lane
DFLASH_INLINE __m256i odd_scale(__m256i word, int i, bool high) {
    return odd_scales(_mm256_and_si256(_mm256_srli_epi32(word, 8 * i + (high ? 4 : 0)), _mm256_set1_epi32(15)));
}

// parts 2l and 2l + 1 of group g: the two halves of 8 rows' grid points n, signed by the bits of byte 0 of signs8
template <class Format>
DFLASH_INLINE void point_halves(typename Format::Packed & out, int g, int l, const uint64_t * grid, __m256i n,
                                __m256i signs8) {
    for (int h = 0; h < 2; ++h) {
        Format::lane_lattice_values(out, g, 2 * l + h, gather_half_points(grid, n, h), negative_bytes(signs8, h));
    }
}

// the 16-bit word i of 8 rows' field at byte `offset` (lanes), read as half of a 32-bit word
template <typename Row>
DFLASH_INLINE __m256i lanes_u16(const TileRows<Row> & r, size_t offset, int i) {
    const __m256i pair = r.lanes_u32(offset + 4 * (i / 2));
    return _mm256_and_si256(_mm256_srli_epi32(pair, 16 * (i % 2)), _mm256_set1_epi32(0xFFFF));
}

// IQ2_XS's and IQ2_S's scales of group g: scales[g]'s low nibble for values 0..15, its high one for 16..31
template <typename Row>
DFLASH_INLINE void half_scales(const TileRows<Row> & r, int g, HalvesPackedT<V8> & out) {
    const __m256i scales = r.lanes_u32(offsetof(Row, scales) + 4 * (g / 4));
    out.sc[g] = odd_scale(scales, g % 4, false);
    out.sc_hi[g] = odd_scale(scales, g % 4, true);
}

// ggml's dequantize_row_iq2_xxs: per group g two 32-bit words at qs[8g]: the first 4 grid indices (index l: values
// 8l..8l+7), the second 7 sign bits per index at bit 7l and ls_g in its top 4 bits
struct IQ2_XXS : SignedGroups<IQ2_XXS, block_iq2_xxs, 0> {
    static constexpr float D_SCALE = 0.125f;   // of d in every float step (w = d * D_SCALE * sc * v)

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, Packed & out) {
        using V = V8;
        const TileRows<block_iq2_xxs> r(t, b);
        constexpr size_t QS = offsetof(block_iq2_xxs, qs);
        for (int g = 0; g < GROUPS; ++g) {
            const __m256i indices = r.lanes_u32(QS + 8 * g);
            const __m256i word = r.lanes_u32(QS + 8 * g + 4);
            out.sc[g] = odd_scales(V::srli32(word, 28));
            for (int l = 0; l < 4; ++l) {
                const __m256i n = lane_byte<V>(indices, l);
                const __m256i signs = sign_field(word, l);
                point_halves<IQ2_XXS>(out, g, l, iq2xxs_grid, n, signs);
            }
        }
        finish_unpack(out, r.lanes_f16(0));
    }
};

// ggml's dequantize_row_iq2_xs: per group g four 16-bit words at qs[4g]: a 9-bit grid index and 7 sign bits (above
// it) each; scales[g] the two ls (half_scales)
struct IQ2_XS : SignedGroups<IQ2_XS, block_iq2_xs, 0, true> {
    static constexpr float D_SCALE = 0.125f;   // of d in every float step (w = d * D_SCALE * sc * v)

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, Packed & out) {
        using V = V8;
        const TileRows<block_iq2_xs> r(t, b);
        for (int g = 0; g < GROUPS; ++g) {
            half_scales(r, g, out);
            for (int l = 0; l < 4; ++l) {
                const __m256i word = lanes_u16(r, offsetof(block_iq2_xs, qs), 4 * g + l);
                const __m256i n = V::and_(word, V::set1(511));
                const __m256i signs = with_parity_bit(V::srli32(word, 9));
                point_halves<IQ2_XS>(out, g, l, iq2xs_grid, n, signs);
            }
        }
        finish_unpack(out, r.lanes_f16(0));
    }
};

// ggml's dequantize_row_iq2_s: group g's 4 grid indices in qs[4g..4g+3] with their ninth and tenth bits in qh[g]
// (bits 2l, 2l + 1 for index l), the sign bits of values 8l..8l+7 in qs[32 + 4g + l]; scales as IQ2_XS
struct IQ2_S : SignedGroups<IQ2_S, block_iq2_s, 0, true> {
    static constexpr float D_SCALE = 0.125f;   // of d in every float step (w = d * D_SCALE * sc * v)

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, Packed & out) {
        using V = V8;
        const TileRows<block_iq2_s> r(t, b);
        constexpr size_t QS = offsetof(block_iq2_s, qs);
        for (int g = 0; g < GROUPS; ++g) {
            half_scales(r, g, out);
            const __m256i high = lane_byte<V>(r.lanes_u32(offsetof(block_iq2_s, qh) + 4 * (g / 4)), g % 4);
            const __m256i indices = r.lanes_u32(QS + 4 * g);
            const __m256i signs = r.lanes_u32(QS + QK_K / 8 + 4 * g);
            for (int l = 0; l < 4; ++l) {
                const __m256i top = V::slli32(V::and_(V::srli32(high, 2 * l), V::set1(3)), 8);
                const __m256i n = V::or_(lane_byte<V>(indices, l), top);
                point_halves<IQ2_S>(out, g, l, iq2s_grid, n, lane_byte<V>(signs, l));
            }
        }
        finish_unpack(out, r.lanes_f16(0));
    }
};

// ---- IQ1_S, IQ1_M ----
// Grid points of 8 values in {-1, 0, 1} (ggml's iq1s_grid, bytes), shifted by +-IQ1S_DELTA = +-1/8:
// w = d * (2 ls + 1) * (point + delta) = d / 8 * (2 ls + 1) * (8 point +- 1), so the tile holds v = 8 point +- 1 (|v| <= 9).

// 8 point + delta of 8 rows' half h of grid points n (lanes), delta the bytes +-1 of each lane
DFLASH_INLINE __m256i shifted_points(__m256i n, int h, __m256i delta) {
    const __m256i point = gather_half_points(iq1s_grid, n, h);
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), point), delta);
}

// the bytes -1 where bit `bit` of a lane is set, 1 elsewhere
DFLASH_INLINE __m256i delta_bytes(__m256i word, int bit) {
    return _mm256_or_si256(_mm256_srai_epi32(_mm256_slli_epi32(word, 31 - bit), 31), _mm256_set1_epi8(1));
}

// parts 2l and 2l + 1 of group g: 8 rows' grid point l, its low 8 index bits byte l of indices, its high 3 at bit
// `high_bit` of qh, shifted by delta
template <class Format>
DFLASH_INLINE void shifted_point_halves(typename Format::Packed & out, int g, int l, __m256i indices, __m256i qh,
                                        int high_bit, __m256i delta) {
    const __m256i high = _mm256_and_si256(_mm256_srli_epi32(qh, high_bit), _mm256_set1_epi32(7));
    const __m256i n = _mm256_or_si256(lane_byte<V8>(indices, l), _mm256_slli_epi32(high, 8));
    for (int h = 0; h < 2; ++h) {
        Format::lane_signed_values(out, g, 2 * l + h, shifted_points(n, h, delta));
    }
}

// ggml's dequantize_row_iq1_s: per group g a 16-bit qh[g]: the high 3 bits of its 4 grid indices (index l: bits 3l..3l+2;
// the low 8 in qs[4g + l]; point l: values 8l..8l+7), ls_g in bits 12..14 and the sign of the group's delta in bit 15
struct IQ1_S : SignedGroups<IQ1_S, block_iq1_s, 0> {
    static constexpr float D_SCALE = 0.125f;   // of d in every float step (w = d * D_SCALE * sc * v)

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, Packed & out) {
        using V = V8;
        const TileRows<block_iq1_s> r(t, b);
        for (int g = 0; g < GROUPS; ++g) {
            const __m256i qh = lanes_u16(r, offsetof(block_iq1_s, qh), g);
            out.sc[g] = odd_scales(V::and_(V::srli32(qh, 12), V::set1(7)));
            const __m256i delta = delta_bytes(qh, 15);
            const __m256i indices = r.lanes_u32(offsetof(block_iq1_s, qs) + 4 * g);
            for (int l = 0; l < 4; ++l) {
                shifted_point_halves<IQ1_S>(out, g, l, indices, qh, 3 * l, delta);
            }
        }
        finish_unpack(out, r.lanes_f16(0));
    }
};

// ggml's dequantize_row_iq1_m: no d field; its fp16 is the top nibbles of the four 16-bit words of scales (the first
// word's the lowest), whose word g / 2 holds ls of group g's values 0..15 and 16..31 at bits 6 (g % 2) and
// 6 (g % 2) + 3; per group a 16-bit word of qh (qh[2g], qh[2g + 1]) holds for grid index l (low 8 bits in qs[4g + l])
// its high 3 bits at bits 4l..4l+2 and the sign of its point's delta at bit 4l + 3
struct IQ1_M : SignedGroups<IQ1_M, block_iq1_m, 0, true> {
    static constexpr float D_SCALE = 0.125f;   // of d in every float step (w = d * D_SCALE * sc * v)

    static DFLASH_INLINE void unpack(const Tile & t, int64_t b, Packed & out) {
        using V = V8;
        const TileRows<block_iq1_m> r(t, b);
        constexpr size_t SCALES = offsetof(block_iq1_m, scales);
        const __m256i low = r.lanes_u32(SCALES), high = r.lanes_u32(SCALES + 4);
        for (int g = 0; g < GROUPS; ++g) {
            const __m256i scales = g < 4 ? low : high;
            const int shift = 16 * ((g / 2) % 2) + 6 * (g % 2);
            out.sc[g] = odd_scales(V::and_(V::srli32(scales, shift), V::set1(7)));
            out.sc_hi[g] = odd_scales(V::and_(V::srli32(scales, shift + 3), V::set1(7)));
            const __m256i qh = lanes_u16(r, offsetof(block_iq1_m, qh), g);
            const __m256i indices = r.lanes_u32(offsetof(block_iq1_m, qs) + 4 * g);
            for (int l = 0; l < 4; ++l) {
                shifted_point_halves<IQ1_M>(out, g, l, indices, qh, 4 * l, delta_bytes(qh, 4 * l + 3));
            }
        }
        const __m256i d = V::or_(V::or_(V::and_(V::srli32(low, 12), V::set1(0x000F)), V::and_(V::srli32(low, 24), V::set1(0x00F0))),
                                 V::or_(V::and_(V::srli32(high, 4), V::set1(0x0F00)), V::and_(V::srli32(high, 16), V::set1(0xF000))));
        finish_unpack(out, f16_half_lanes(d, false));
    }
};

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

DFLASH_CPU_GEMM_ENTRY(gemm_iq4_xs, IQ4_XS)
DFLASH_CPU_GEMM_ENTRY(gemm_iq3_xxs, IQ3_XXS)
DFLASH_CPU_GEMM_ENTRY(gemm_iq3_s, IQ3_S)
DFLASH_CPU_GEMM_ENTRY(gemm_iq2_xxs, IQ2_XXS)
DFLASH_CPU_GEMM_ENTRY(gemm_iq2_xs, IQ2_XS)
DFLASH_CPU_GEMM_ENTRY(gemm_iq2_s, IQ2_S)
DFLASH_CPU_GEMM_ENTRY(gemm_iq1_s, IQ1_S)
DFLASH_CPU_GEMM_ENTRY(gemm_iq1_m, IQ1_M)

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
