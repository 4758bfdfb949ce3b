// dflash-gguf: the shared x86 skeleton of our CPU matrix multiplies (internal to ggml-kernels/cpu).
//
// Compiled once per instruction set (CMake: -DDFLASH_CPU_VARIANT=avx2 or avx512, see isa.h); the
// kernels land in namespace dflash_cpu::<variant> and gemm.cpp picks one at run time.
//
// A weight format describes each 32 weights of a row as w = d * q + m with q unsigned (Q4_1: q in
// 0..15 and its min m; Q8_0: q + 128 in 1..255 and m = -128 d; Q4_0: q in 0..15 and m = -8 d; the
// K-quants: d = super-block scale x sub-block scale), and activations as a = d_a * p with p in
// -127..127. Then per 32 weights
//   sum(w * a) = d * d_a * sum(q * p) + m * d_a * sum(p)
// with sum(q * p) exact in integers. A format's block (ggml's) holds one such group of 32, or 8 (the
// K-quants' 256), and its activation block one Format::Scale. The format supplies the unpacking of a
// block of a tile's rows into vector lanes (Format::PackedT<V>: 8 rows in a __m256, V8; with AVX-512 16 in a
// __m512, V16, for formats with PAIR_TILES), or the integer sums of untransposed rows (dot_rows / row_sums, up
// to ROWWISE_MAX columns), and the float steps of a column (Format::column / columns, Format::finish /
// finish_row); this file has the rest: threads, tiles, passes over columns, the exact integer dot steps and the
// float step of the 32-weight formats (block_fma). Every path takes the same integer sums and the same float
// operations per output, whatever the batch width, vector width or instruction set: the same bits.
#pragma once

#include "isa.h"

#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DFLASH_CPU_GEMM_X86 1
#include <immintrin.h>
#endif
// u8 x s8 dot products without int16 saturation (needed by 8-bit unsigned weights)
#if DFLASH_CPU_GEMM_X86 && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
#define DFLASH_CPU_GEMM_VNNI 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DFLASH_DPBUSD _mm256_dpbusd_epi32
#else
#define DFLASH_DPBUSD _mm256_dpbusd_avx_epi32
#endif
#endif

namespace dflash_cpu {
namespace DFLASH_CPU_VARIANT {

#if DFLASH_CPU_GEMM_X86

// the per-block steps must melt into the loop of every column-count instantiation...
#define DFLASH_INLINE inline __attribute__((always_inline))
// ...while each instantiation stays a function of its own with its own registers and frame
#define DFLASH_NOINLINE __attribute__((noinline))

// Columns per pass over a weight tile. A batch of up to DIRECT_MAX columns is one pass that unpacks
// the weights on the fly; wider batches unpack each tile into a buffer once and make passes of
// PACKED_RN columns over it. AVX-512 has 32 registers: 16 accumulators + 8 unpacked weight vectors +
// scales fit, so a verify batch of 16 is one pass. With the 16 AVX2 registers the compiler spills, and
// measured (Q4_1, SmolLM2 shapes, 1 thread) one pass still wins up to 8 columns (B=8: 12.1 vs 13.8 ms)
// but passes of 4 over the buffer win above (B=16: 24.1 vs 28.6 ms).
#if defined(__AVX512F__)
#define DFLASH_CPU_GEMM_DIRECT_MAX 16
#define DFLASH_CPU_GEMM_PACKED_RN 16
#else
#define DFLASH_CPU_GEMM_DIRECT_MAX 8
#define DFLASH_CPU_GEMM_PACKED_RN 4
#endif

namespace {

constexpr int TILE_ROWS = 8;   // one weight row per float lane of a __m256
constexpr int DIRECT_MAX = DFLASH_CPU_GEMM_DIRECT_MAX;
constexpr int PACKED_RN = DFLASH_CPU_GEMM_PACKED_RN;
constexpr int ROW_RN = 4;      // columns per row-wise pass (the tile's rows stay in L1 between passes)
constexpr int ROW_PREFETCH_BLOCKS = 8;   // row-major formats: blocks fetched ahead in the weight stream
constexpr int MAX_RN = DIRECT_MAX > PACKED_RN ? DIRECT_MAX : PACKED_RN;

DFLASH_INLINE uint32_t load_u32(const void * p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

template <typename T>
T * grow(std::vector<T> & v, size_t n) {
    if (v.size() < n) {
        v.resize(n);
    }
    return v.data();
}

// The vectors the per-column steps run on, lane r = weight row r: 8 rows in a __m256 (V8, every variant), or
// with AVX-512 two adjacent 8-row tiles side by side in a __m512 (V16), which halves the broadcasts and
// instructions per row. Each lane takes the same integer and float steps either way, so a row's result has the
// same bits in both.
struct V8 {
    using I = __m256i;
    using F = __m256;
    static constexpr int ROWS = 8;
    static DFLASH_INLINE I zero() { return _mm256_setzero_si256(); }
    static DFLASH_INLINE F zerof() { return _mm256_setzero_ps(); }
    static DFLASH_INLINE I set1(int v) { return _mm256_set1_epi32(v); }
    static DFLASH_INLINE F set1f(float v) { return _mm256_set1_ps(v); }
    static DFLASH_INLINE I add(I a, I b) { return _mm256_add_epi32(a, b); }
    static DFLASH_INLINE I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
    static DFLASH_INLINE I mullo(I a, I b) { return _mm256_mullo_epi32(a, b); }
    static DFLASH_INLINE I madd16(I a, I b) { return _mm256_madd_epi16(a, b); }
    static DFLASH_INLINE I and_(I a, I b) { return _mm256_and_si256(a, b); }
    static DFLASH_INLINE I or_(I a, I b) { return _mm256_or_si256(a, b); }
    template <int N> static DFLASH_INLINE I slli(I a) { return _mm256_slli_epi32(a, N); }
    static DFLASH_INLINE F cvt(I a) { return _mm256_cvtepi32_ps(a); }
    static DFLASH_INLINE F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static DFLASH_INLINE F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
#if DFLASH_CPU_GEMM_VNNI
    static DFLASH_INLINE I dpbusd(I acc, I u, I s) { return DFLASH_DPBUSD(acc, u, s); }
#endif
    static DFLASH_INLINE void store(float * out, F v) { _mm256_storeu_ps(out, v); }
    static DFLASH_INLINE I set1_8(char v) { return _mm256_set1_epi8(v); }
    static DFLASH_INLINE I srli16(I a, int n) { return _mm256_srli_epi16(a, n); }
    static DFLASH_INLINE I slli16(I a, int n) { return _mm256_slli_epi16(a, n); }
    static DFLASH_INLINE I srli32(I a, int n) { return _mm256_srli_epi32(a, n); }
    static DFLASH_INLINE I slli32(I a, int n) { return _mm256_slli_epi32(a, n); }
    static DFLASH_INLINE I srai32(I a, int n) { return _mm256_srai_epi32(a, n); }
    static DFLASH_INLINE F neg(F a) { return _mm256_sub_ps(_mm256_setzero_ps(), a); }
};

#if defined(__AVX512F__) && DFLASH_CPU_GEMM_VNNI
#define DFLASH_CPU_GEMM_V16 1
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns inside its own AVX-512 intrinsics (their undefined pass-through operands)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
struct V16 {
    using I = __m512i;
    using F = __m512;
    static constexpr int ROWS = 16;
    static DFLASH_INLINE I zero() { return _mm512_setzero_si512(); }
    static DFLASH_INLINE F zerof() { return _mm512_setzero_ps(); }
    static DFLASH_INLINE I set1(int v) { return _mm512_set1_epi32(v); }
    static DFLASH_INLINE F set1f(float v) { return _mm512_set1_ps(v); }
    static DFLASH_INLINE I add(I a, I b) { return _mm512_add_epi32(a, b); }
    static DFLASH_INLINE I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
    static DFLASH_INLINE I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
    static DFLASH_INLINE I madd16(I a, I b) { return _mm512_madd_epi16(a, b); }
    static DFLASH_INLINE I and_(I a, I b) { return _mm512_and_si512(a, b); }
    static DFLASH_INLINE I or_(I a, I b) { return _mm512_or_si512(a, b); }
    template <int N> static DFLASH_INLINE I slli(I a) { return _mm512_slli_epi32(a, N); }
    static DFLASH_INLINE F cvt(I a) { return _mm512_cvtepi32_ps(a); }
    static DFLASH_INLINE F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static DFLASH_INLINE F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static DFLASH_INLINE I dpbusd(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
    static DFLASH_INLINE void store(float * out, F v) { _mm512_storeu_ps(out, v); }
};
#endif

// An unpacked block of two adjacent tiles side by side (V16) from each tile's own (V8): every member vector of
// P8 is a __m256 or __m256i, P16 has the same members as __m512 / __m512i
template <class P8, class P16>
DFLASH_INLINE void widen(const P8 & lo, const P8 & hi, P16 & out) {
#if DFLASH_CPU_GEMM_V16
    static_assert(sizeof(P8) % sizeof(__m256i) == 0 && sizeof(P16) == 2 * sizeof(P8), "vector members only");
    const __m256i * a = (const __m256i *) &lo;
    const __m256i * b = (const __m256i *) &hi;
    __m512i * o = (__m512i *) &out;
    for (size_t i = 0; i < sizeof(P8) / sizeof(__m256i); ++i) {
        o[i] = _mm512_inserti64x4(_mm512_castsi256_si512(a[i]), b[i], 1);
    }
#else
    (void) lo; (void) hi; (void) out;
#endif
}

// One block of a tile of 8 weight rows, transposed: lane r of q[g] holds the 4 unsigned quants of
// row r at positions 4g..4g+3 of the block, so one dot step against 4 activation bytes broadcast to
// all lanes advances all 8 rows at once and the result needs no horizontal sum.
template <class V>
struct PackedBlockT {
    typename V::I q[8];
    typename V::F d;      // scale of each row's 32 weights
    typename V::F m;      // min of each row's 32 weights (formats with a min term)
};
using PackedBlock = PackedBlockT<V8>;

// 8 rows of 32 bytes, transposed by 4-byte groups: out[g] lane r = bytes 4g..4g+3 of row r
DFLASH_INLINE void transpose_groups(const __m256i (&x)[TILE_ROWS], __m256i (&out)[TILE_ROWS]) {
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
    for (int k = 0; k < 4; ++k) {
        out[k]     = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        out[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

// 32 bytes at p of each of 8 rows, transposed (transpose_groups)
template <typename Row>
DFLASH_INLINE void load_transposed(const Row * const (&r)[TILE_ROWS], size_t offset, __m256i (&out)[TILE_ROWS]) {
    __m256i x[TILE_ROWS];
    for (int i = 0; i < TILE_ROWS; ++i) {
        x[i] = _mm256_loadu_si256((const __m256i *) ((const char *) r[i] + offset));
    }
    transpose_groups(x, out);
}

// 16 bytes at offset of each of 8 rows, transposed by 4-byte groups: out[g] lane r = bytes 4g..4g+3 of row r
template <typename Row>
DFLASH_INLINE void load_transposed16(const Row * const (&r)[TILE_ROWS], size_t offset, __m256i (&out)[4]) {
    // 4x4 dword transpose in each 128-bit lane: rows 0..3 in the low lane, rows 4..7 in the high one
    const auto at = [&](int i) { return (const __m128i *) ((const char *) r[i] + offset); };
    const __m256i x0 = _mm256_loadu2_m128i(at(4), at(0));
    const __m256i x1 = _mm256_loadu2_m128i(at(5), at(1));
    const __m256i x2 = _mm256_loadu2_m128i(at(6), at(2));
    const __m256i x3 = _mm256_loadu2_m128i(at(7), at(3));
    const __m256i t0 = _mm256_unpacklo_epi32(x0, x1);
    const __m256i t1 = _mm256_unpackhi_epi32(x0, x1);
    const __m256i t2 = _mm256_unpacklo_epi32(x2, x3);
    const __m256i t3 = _mm256_unpackhi_epi32(x2, x3);
    out[0] = _mm256_unpacklo_epi64(t0, t2);
    out[1] = _mm256_unpackhi_epi64(t0, t2);
    out[2] = _mm256_unpacklo_epi64(t1, t3);
    out[3] = _mm256_unpackhi_epi64(t1, t3);
}

// the 32-bit word at offset of each of 8 rows, lane r = row r
template <typename Row>
DFLASH_INLINE __m256i load_lanes_u32(const Row * const (&r)[TILE_ROWS], size_t offset) {
    const auto at = [&](int i) { return (int) load_u32((const char *) r[i] + offset); };
    return _mm256_setr_epi32(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7));
}

// the fp16 at offset of each of 8 rows as floats, lane r = row r
template <typename Row>
DFLASH_INLINE __m256 load_lanes_f16(const Row * const (&r)[TILE_ROWS], size_t offset) {
    uint16_t h[TILE_ROWS];
    for (int i = 0; i < TILE_ROWS; ++i) {
        memcpy(&h[i], (const char *) r[i] + offset, sizeof h[i]);
    }
    return _mm256_cvtph_ps(_mm_setr_epi16((short) h[0], (short) h[1], (short) h[2], (short) h[3], (short) h[4],
                                          (short) h[5], (short) h[6], (short) h[7]));
}

// Nibble-packed 32 weights (byte k: value k in the low nibble, value k + 16 in the high one, as Q4_0,
// Q4_1, Q5_0 store them) of 8 rows at offset, into q[0..8) of a packed block
template <typename Row>
DFLASH_INLINE void unpack_nibbles32(const Row * const (&r)[TILE_ROWS], size_t offset, PackedBlock & out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i g[4];
    load_transposed16(r, offset, g);
    for (int k = 0; k < 4; ++k) {
        out.q[k]     = _mm256_and_si256(g[k], low4);
        out.q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(g[k], 4), low4);
    }
}

// a block's 32 nibbles in value order (value k: low nibble of byte k, value k + 16: high nibble of byte k)
DFLASH_INLINE __m256i nibbles_in_order(const uint8_t * qs) {
    // the 16 bytes in both halves, the high half shifted down 4 bits (the bits that come in from the next byte are
    // masked off with the high nibble)
    const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) qs));
    return _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
}

// The same from two 128-bit halves: AVX2's IQ4_NL steps row-wise at every width, and there the one-broadcast form
// measured 1.06-1.13x slower from 4 columns (0.84-0.86x at one; 4096 x 2048, 1 thread, in-process A/B)
DFLASH_INLINE __m256i nibbles_in_order_halves(const uint8_t * qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *) qs);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), low4), _mm_and_si128(x, low4));
}

// sum of each 32-bit lane of 8 vectors, one lane per vector: lane r = sum of v[r]'s 8 lanes
DFLASH_INLINE __m256i sum_lanes(const __m256i (&v)[TILE_ROWS]) {
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]);
    const __m256i h23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]);
    const __m256i h67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i h0123 = _mm256_hadd_epi32(h01, h23);   // rows 0..3: low half, then high half
    const __m256i h4567 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

DFLASH_INLINE int32_t hsum_i32_128(__m128i x) {
    x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 1));
    return _mm_cvtsi128_si32(x);
}

DFLASH_INLINE int32_t hsum_i32(__m256i v) {
    return hsum_i32_128(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

struct ColumnScale {
    float d;       // d_a of an activation block
    float s;       // d_a * sum(p), for formats whose min term is a float FMA (Q4_1)
    int32_t bias;  // 128 * sum(p), for formats whose min term is exact in integers (Q8_0)
};

// A Q8_0 activation block's scale, and the integer offset term offset * sum(p) of formats that store
// q + offset unsigned (Q8_0: 128, Q4_0: 8, Q5_0: 16)
inline ColumnScale q8_0_column_scale(const block_q8_0 & y, int32_t offset) {
    int32_t sum = 0;
    for (int i = 0; i < QK8_0; ++i) {
        sum += y.qs[i];
    }
    uint16_t d;
    memcpy(&d, &y, sizeof d);   // the fp16 that opens a block
    return ColumnScale{_cvtsh_ss(d), 0.0f, offset * sum};
}

// The batch's activations re-laid block-major, so that the inner loop walks two pointers with
// constant offsets instead of one pointer per column.
template <class Format>
struct Activations {
    using Scale = typename Format::Scale;
    static constexpr int64_t QK = sizeof(((const typename Format::ActBlock *) nullptr)->qs);   // quants per block
    const int8_t * q;            // [n_blocks][n_cols][QK]
    const Scale * scale;         // [n_blocks][n_cols]
    int64_t n_cols;

    DFLASH_INLINE const int8_t * quants(int64_t b, int64_t j) const {
        return q + (b * n_cols + j) * QK;
    }
    DFLASH_INLINE const Scale * scales(int64_t b, int64_t j) const { return scale + b * n_cols + j; }
};

// 8 weight rows at a constant stride (the last, partial tile of a matrix is a padded copy).
struct Tile {
    const char * base;     // row 0
    size_t stride;         // bytes from one row to the next
    const char * next;     // first byte of the thread's next tile, or nullptr
    size_t next_step;      // bytes of the next tile to prefetch per block
    bool interleaved = false;   // the tile's rows word-interleaved by block (gemm.h: dflash_cpu_interleave)

    // Rows 0..7 of block b (of block_size bytes), spelled so that a base, a stride and 3*stride
    // address all 8 and the loop keeps few registers for them.
    template <typename Block>
    DFLASH_INLINE void rows(int64_t b, const Block * (&r)[TILE_ROWS]) const {
        const char * p = base + b * sizeof(Block);
        const size_t s = stride;
        const size_t s3 = 3 * s;
        const char * p3 = p + s3;
        r[0] = (const Block *) p;
        r[1] = (const Block *) (p + s);
        r[2] = (const Block *) (p + 2 * s);
        r[3] = (const Block *) p3;
        r[4] = (const Block *) (p + 4 * s);
        r[5] = (const Block *) (p3 + 2 * s);
        r[6] = (const Block *) (p3 + s3);
        r[7] = (const Block *) (p3 + 4 * s);
    }

    // The weights stream from memory once per tile and the hardware prefetcher does not follow 8
    // interleaved rows well, so fetch the next tile in step with this one. Measured over the 30 SmolLM2
    // layers (Q4_1, 63 MB, 1 thread): without it B=1 took 8.9 ms (ggml's vec_dot: 7.5), with it 5.4;
    // prefetching 2 or 4 tiles ahead was not better, nor (there, at B=1) into L2 only.
    // Into L2, not L1 (2026-12-03): a tile ahead is a whole tile's blocks (9 KB of 8 Q4_K rows of 2048, 27 KB
    // of 6144), and fetched into L1 beside the tile in use and a batch's activations (8 columns of 6144: 49 KB)
    // it pushed out what the dot steps were about to read. Zen 4 (32 KB L1), 1 thread, 65,536 x 2048 weights,
    // in-process alternation, medians: Q4_K B = 1 5.0 -> 3.4 ms, B = 8 10.7 -> 9.9 and 10.7 -> 11.2 in two runs,
    // Q8_0 B = 1 / 8 4.6 / 6.2 -> 3.3 / 3.4, Q5_K 8.2 / 16.5 -> 6.5 / 14.3, Q6_K 5.4 / 16.2 -> 5.3 / 13.8; the ~2B
    // Q4_K_M target, 2 threads: B = 1 / 4 / 8 -5 % / -12 % / -4..-10 %, its Q4_0 -14 % / -9 % / -8 %.
    // Part `part` of `parts` of it: the K-quants' blocks are large (28 lines of Q6_K's 8 rows), and one burst of
    // prefetches waits for free miss buffers where unpacking and dot steps could run
    DFLASH_INLINE void prefetch_next(int64_t b, int part = 0, int parts = 1) const {
        if (next != nullptr) {
            const char * p = next + b * next_step;
            const size_t lines = (next_step + 126) / 64;    // the lines `next_step` bytes from p can touch
            for (size_t l = lines * part / parts; l < lines * (part + 1) / parts; ++l) {
                _mm_prefetch(p + 64 * l, _MM_HINT_T1);
            }
        }
    }

    // block b of an interleaved tile: the 8 rows' blocks, one after the other in the layout gemm.h describes
    template <typename Block>
    DFLASH_INLINE const char * interleaved_block(int64_t b) const {
        return base + b * (int64_t) (TILE_ROWS * sizeof(Block));
    }

    // rows 8..15 of a 16-row tile (V16), as a tile of their own that fetches nothing ahead
    DFLASH_INLINE Tile second_half() const { return Tile{base + TILE_ROWS * stride, stride, nullptr, 0, interleaved}; }
};

// An interleaved tile's 8 fp16 in the low (high: the high) halves of the 32-bit lanes of w, as floats, lane r = row r
DFLASH_INLINE __m256 f16_half_lanes(__m256i w, bool high) {
    const __m256i h = high ? _mm256_srli_epi32(w, 16) : _mm256_and_si256(w, _mm256_set1_epi32(0xFFFF));
    const __m256i packed =
        _mm256_permutevar8x32_epi32(_mm256_packus_epi32(h, h), _mm256_setr_epi32(0, 1, 4, 5, 0, 1, 4, 5));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
}

// Word k of an interleaved block's 8 rows of nibble-packed weights (Q4_0, Q4_1, Q5_0: 4 words at `words`, 32 bytes
// each, byte i of a word holding value 4 k + i in its low nibble and 16 + 4 k + i in its high one): the lanes of
// q[k] (low nibbles) and q[k + 4] (high nibbles)
DFLASH_INLINE void interleaved_nibbles(const char * words, PackedBlock & out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
        const __m256i word = _mm256_loadu_si256((const __m256i *) (words + 32 * k));
        out.q[k] = _mm256_and_si256(word, low4);
        out.q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(word, 4), low4);
    }
}

// The fifth bits of a block of 8 rows of 5-bit quants (Q5_0, Q5_1: bit k of a row's 32-bit qh is value k's), lane r
// of qh = row r's, added as 0x10 to the unpacked nibbles: q[k] byte i (value 4k + i) takes bit 4k + i, i.e. bit
// 4 (k % 2) + i of byte k / 2 of its lane's word
DFLASH_INLINE void add_fifth_bit_lanes(__m256i qh, PackedBlock & out) {
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
        const __m256i picked = _mm256_shuffle_epi8(qh, spread);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        out.q[k] = _mm256_mask_add_epi8(out.q[k], _mm256_test_epi8_mask(picked, bit), out.q[k], fifth);
#else
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(picked, bit), bit);
        out.q[k] = _mm256_or_si256(out.q[k], _mm256_and_si256(set, fifth));
#endif
    }
}

// The same from an interleaved block's bit planes (Q5_0 where the CPU's best variant is not AVX-512's, Q5_1: gemm.h): bit k
// of byte 4 r + i is the fifth bit of byte 4 r + i of q[k]. AVX2 moves it to 0x10 with one 16-bit shift (bit 4 of
// either byte of a 16-bit lane comes from that byte's bit k) and an and; AVX-512 tests it into a mask.
DFLASH_INLINE void add_fifth_bit_planes(__m256i planes, PackedBlock & out) {
    const __m256i fifth = _mm256_set1_epi8(0x10);
    for (int k = 0; k < 8; ++k) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        const __mmask32 set = _mm256_test_epi8_mask(planes, _mm256_set1_epi8((char) (1 << k)));
        out.q[k] = _mm256_mask_add_epi8(out.q[k], set, out.q[k], fifth);
#else
        const __m256i moved = k < 4 ? _mm256_slli_epi16(planes, 4 - k) : k > 4 ? _mm256_srli_epi16(planes, k - 4) : planes;
        out.q[k] = _mm256_or_si256(out.q[k], _mm256_and_si256(moved, fifth));
#endif
    }
}

// Block b of an interleaved tile whose blocks open with one fp16 scale (Q4_0, Q5_0, Q8_0, IQ4_NL; gemm.h): the 8
// rows' scales into out.d (out.m zero); returns the block's words, which follow the scales
template <typename Block>
DFLASH_INLINE const char * scales_first_block(const Tile & t, int64_t b, PackedBlock & out) {
    const char * block = t.interleaved_block<Block>(b);
    out.d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) block));
    out.m = _mm256_setzero_ps();
    return block + 2 * TILE_ROWS;
}

// Block b of each of a tile's 8 rows (Tile::rows), and what the K-quants' unpacking reads from them: lane r = row r
// An interleaved tile stores block b of its rows as words: 4-byte word w of row r at 32 * w + 4 * r, so a
// word's 8 rows are one vector already, lane r = row r (offsets of multiples of 4 only).
template <typename Row>
struct TileRows {
    const Row * r[TILE_ROWS] = {};
    const char * words = nullptr;   // block b of an interleaved tile

    // whole words and a closing fp16 (Q6_K, Q3_K), or an opening fp16 and whole words (every other block with one
    // fp16 beside whole words: the lattice IQ types here), whose 8 rows' fp16 the interleaved block keeps side by side
    // after (before) the words: the rule dflash_cpu_interleave lays them out by
    static constexpr bool CLOSING_F16 = std::is_same_v<Row, block_q6_K> || std::is_same_v<Row, block_q3_K>;
    static constexpr bool OPENING_F16 = sizeof(Row) % 4 == 2 && !CLOSING_F16;

    DFLASH_INLINE TileRows(const Tile & t, int64_t b) {
        // formats of whole words, with or without one fp16 (dflash_cpu_interleave_wanted)
        if constexpr (sizeof(Row) % 4 == 0 || CLOSING_F16 || OPENING_F16) {
            if (t.interleaved) {
                words = t.interleaved_block<Row>(b);
                return;
            }
        }
        t.rows(b, r);
    }

    // 32 bytes at offset of each row, transposed by 4-byte groups (transpose_groups)
    DFLASH_INLINE void transposed(size_t offset, __m256i (&out)[TILE_ROWS]) const {
        if (words != nullptr) {
            for (int k = 0; k < TILE_ROWS; ++k) {
                out[k] = word_lanes(offset + 4 * k);
            }
        } else {
            load_transposed(r, offset, out);
        }
    }
    DFLASH_INLINE __m256i lanes_u32(size_t offset) const {
        return words != nullptr ? word_lanes(offset) : load_lanes_u32(r, offset);
    }
    DFLASH_INLINE __m256 lanes_f16(size_t offset) const {
        if (words == nullptr) {
            return load_lanes_f16(r, offset);
        }
        // the closing or opening fp16: the 8 rows' side by side (where word_lanes would put them)
        if ((CLOSING_F16 && offset + 2 == sizeof(Row)) || (OPENING_F16 && offset == 0)) {
            return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (words + 8 * offset)));
        }
        return f16_half_lanes(word_lanes(offset & ~(size_t) 3), offset % 4 != 0);
    }

  private:
    // the word at row offset `offset`: at 8 * offset in the block, an opening fp16's 8 rows included
    DFLASH_INLINE __m256i word_lanes(size_t offset) const {
        return _mm256_loadu_si256((const __m256i *) (words + 8 * offset));
    }
};

// sum over N groups of 4 of q * p for the rows of a packed block (q[0..N), lane r = row r) and 4N
// activation quants p; MAX_Q bounds the unsigned weight quants (AVX2 keeps pair sums in int16)
template <int MAX_Q, int N, class V = V8>
DFLASH_INLINE typename V::I dot_groups(const typename V::I * q, const int8_t * p) {
#if DFLASH_CPU_GEMM_VNNI
    typename V::I even = V::zero();
    typename V::I odd = V::zero();
    for (int k = 0; k < N; k += 2) {
        even = V::dpbusd(even, q[k], V::set1((int) load_u32(p + 4 * k)));
        if (k + 1 < N) {
            odd = V::dpbusd(odd, q[k + 1], V::set1((int) load_u32(p + 4 * k + 4)));
        }
    }
    return V::add(even, odd);
#else
    static_assert(V::ROWS == 8, "AVX2 runs 8-row tiles");
    // maddubs pairs |q*p + q*p| <= 2 * MAX_Q * 128; CHUNK of them summed stay within int16
    static_assert(2 * MAX_Q * 128 <= 32767, "maddubs pairs overflow int16 for these quants");
    constexpr int CHUNK = 32767 / (2 * MAX_Q * 128) < N ? 32767 / (2 * MAX_Q * 128) : N;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i total = _mm256_setzero_si256();
    for (int k0 = 0; k0 < N; k0 += CHUNK) {
        __m256i s16 = _mm256_maddubs_epi16(q[k0], _mm256_set1_epi32((int) load_u32(p + 4 * k0)));
        for (int k = k0 + 1; k < k0 + CHUNK && k < N; ++k) {
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[k], _mm256_set1_epi32((int) load_u32(p + 4 * k))));
        }
        total = k0 == 0 ? _mm256_madd_epi16(s16, ones) : _mm256_add_epi32(total, _mm256_madd_epi16(s16, ones));
    }
    return total;
#endif
}

// The float step every kernel of a format shares, whatever computed the exact integer block sums:
// acc += isum * (d * d_a) [+ m * s]. Keeping this sequence (and the block order) fixed per output
// makes a column's result independent of the batch width and of the instruction set that produced
// isum: integer sums are exact, so only these roundings count.
template <class Format, class V = V8>
DFLASH_INLINE typename V::F block_fma(typename V::I isum, typename V::F d, typename V::F m, const ColumnScale & c,
                                      typename V::F acc) {
    const typename V::F dd = V::mul(d, V::set1f(c.d));
    acc = V::fmadd(V::cvt(isum), dd, acc);
    if (Format::FLOAT_MIN) {
        acc = V::fmadd(m, V::set1f(c.s), acc);
    }
    return acc;
}

// One column's step for the 32-weight formats: exact integer sums, then block_fma.
template <class Format, class V>
DFLASH_INLINE typename V::F column_step_32(const PackedBlockT<V> & w, const int8_t * p, const ColumnScale * c,
                                           typename V::F acc) {
    typename V::I isum = dot_groups<Format::MAX_Q, 8, V>(w.q, p);
    if (!Format::FLOAT_MIN) {
        isum = V::sub(isum, V::set1(c->bias));
    }
    return block_fma<Format, V>(isum, w.d, w.m, *c, acc);
}

// Whether Format steps all RN columns of a block at once (Format::columns<RN, V>, flagged COLUMNS_TOGETHER):
// formats whose unpacked block outgrows the registers walk it once, each part against every column, instead of
// once per column (Format::column<V>). Such a format takes at most Format::COLUMN_CHUNK columns a call.
template <class Format, class = void>
struct steps_columns_together : std::false_type {};
template <class Format>
struct steps_columns_together<Format, std::void_t<decltype(Format::COLUMNS_TOGETHER)>>
    : std::bool_constant<Format::COLUMNS_TOGETHER> {};

// What the 32-weight formats share (Q4_0, Q4_1, Q5_0, Q8_0): one scale (and min) per block of 32, activation
// blocks with a ColumnScale, tiles of 8 rows unpacked by Format::unpack (16: two of them widened), and the column
// step (column_step_32)
template <class Self, typename WeightBlock, typename ActivationBlock, int QMAX, bool MIN_TERM>
struct Format32 {
    using Block = WeightBlock;
    using ActBlock = ActivationBlock;
    using Scale = ColumnScale;
    using Packed = PackedBlock;
    template <class V> using PackedT = PackedBlockT<V>;
    static constexpr bool PAIR_TILES = true;
    static constexpr bool ROW_MAJOR = false;
    static constexpr int MAX_Q = QMAX;
    static constexpr bool FLOAT_MIN = MIN_TERM;

    template <class V>
    static DFLASH_INLINE typename V::F column(const PackedBlockT<V> & w, const int8_t * p, const ColumnScale * c,
                                              typename V::F acc) {
        return column_step_32<Self, V>(w, p, c, acc);
    }
};

// Format::columns over RN columns from j0, COLUMN_CHUNK after COLUMN_CHUNK in order (each column's sums are its own)
template <class Format, int RN, class V>
DFLASH_INLINE void columns_in_chunks(const typename Format::template PackedT<V> & w, const Activations<Format> & a,
                                     int64_t b, int64_t j0, typename V::F * acc) {
    constexpr int CHUNK = Format::COLUMN_CHUNK;
    if constexpr (RN > CHUNK) {
        Format::template columns<CHUNK, V>(w, a, b, j0, acc);
        columns_in_chunks<Format, RN - CHUNK, V>(w, a, b, j0 + CHUNK, acc + CHUNK);
    } else {
        Format::template columns<RN, V>(w, a, b, j0, acc);
    }
}

// acc[j] += one weight block (the tile's rows, unpacked) times block b of activation columns j0 + j, j < RN
template <class Format, int RN, class V>
DFLASH_INLINE void accumulate_block(const typename Format::template PackedT<V> & w, const Activations<Format> & a,
                                    int64_t b, int64_t j0, typename V::F * acc) {
    if constexpr (steps_columns_together<Format>::value) {
        columns_in_chunks<Format, RN, V>(w, a, b, j0, acc);
    } else {
        for (int j = 0; j < RN; ++j) {
            acc[j] = Format::template column<V>(w, a.quants(b, j0 + j), a.scales(b, j0 + j), acc[j]);
        }
    }
}

// Widths up to which Format steps the columns of an interleaved tile's block as it reads the block
// (Format::stream_columns<RN>) instead of unpacking the whole block first (Format::STREAM_MAX; 0: never)
template <class Format, class = void>
struct stream_max : std::integral_constant<int, 0> {};
template <class Format>
struct stream_max<Format, std::void_t<decltype(Format::STREAM_MAX)>> : std::integral_constant<int, Format::STREAM_MAX> {};

// Block b of a tile unpacked into lanes: Format::unpack for 8 rows, or both halves of a 16-row tile widened
template <class Format, class V>
DFLASH_INLINE void unpack_lanes(const Tile & t, int64_t b, typename Format::template PackedT<V> & out) {
    if constexpr (V::ROWS == TILE_ROWS) {
        Format::unpack(t, b, out);
    } else {
        typename Format::Packed lo, hi;
        Format::unpack(t, b, lo);
        Format::unpack(t.second_half(), b, hi);
        widen(lo, hi, out);
    }
}

// Columns j0..j0+RN of one tile without transposing it (widths up to Format::ROWWISE_MAX, see q8_0_gemm.cpp):
// per block, Format::dot_rows gives the exact integer sums of the 8 rows for one column.
template <class Format, int RN>
DFLASH_NOINLINE void tile_rows(const Tile & t, int64_t n_blocks, const Activations<Format> & a, int64_t j0,
                               __m256 * acc) {
    static_assert(Activations<Format>::QK == QK8_0, "row-wise sums: 32-weight formats only");
    __m256 sum[RN];
    for (int j = 0; j < RN; ++j) {
        sum[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
        t.prefetch_next(b);
        const typename Format::Block * r[TILE_ROWS];
        t.rows(b, r);
        const __m256 d = Format::row_scales(r);
        for (int j = 0; j < RN; ++j) {
            const ColumnScale & scale = *a.scales(b, j0 + j);
            const __m256i isum = Format::dot_rows(r, a.quants(b, j0 + j), scale);
            sum[j] = block_fma<Format>(isum, d, _mm256_setzero_ps(), scale, sum[j]);
        }
    }
    for (int j = 0; j < RN; ++j) {
        acc[j] = sum[j];
    }
}

// Columns j0..j0+RN of one tile, one weight row after the other (formats with ROW_MAJOR, widths up to
// ROWWISE_MAX): the rows of a tile are one stretch of memory, read in order, with no transpose. Per row and
// block, Format::row_sums gives the exact integers (isum, msum) the transposed path sums in lanes, and
// Format::finish_row takes the float steps of Format::finish for that one row: the same IEEE operations on the
// same values as one lane of the transposed path, so the same bits.
template <class Format, int RN>
DFLASH_NOINLINE void tile_row_major(const Tile & t, int64_t n_blocks, const Activations<Format> & a, int64_t j0,
                                    __m256 * acc) {
    alignas(32) float out[RN][TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; ++r) {
        const auto * row = (const typename Format::Block *) (t.base + r * t.stride);
        float sum[RN] = {};
        for (int64_t b = 0; b < n_blocks; ++b) {
            // the rows are one stream in memory order: fetch a few blocks ahead (past the tile's end: the next
            // tile's rows, or nothing that faults)
            const char * ahead = (const char *) (row + b + ROW_PREFETCH_BLOCKS);
            for (size_t off = 0; off < sizeof(typename Format::Block); off += 64) {
                _mm_prefetch(ahead + off, _MM_HINT_T0);
            }
            const int8_t * p[RN];
            const typename Format::Scale * c[RN];
            for (int j = 0; j < RN; ++j) {
                p[j] = a.quants(b, j0 + j);
                c[j] = a.scales(b, j0 + j);
            }
            int32_t isum[RN], msum[RN];
            Format::template row_sums<RN>(row[b], p, c, isum, msum);
            for (int j = 0; j < RN; ++j) {
                sum[j] = Format::finish_row(row[b], isum[j], msum[j], *c[j], sum[j]);
            }
        }
        for (int j = 0; j < RN; ++j) {
            out[j][r] = sum[j];
        }
    }
    for (int j = 0; j < RN; ++j) {
        acc[j] = _mm256_load_ps(out[j]);
    }
}

// Columns j0..j0+RN of one tile, straight from the weight rows: acc[j] lane r = row r . column j0+j.
template <class Format, int RN, class V>
DFLASH_NOINLINE void tile_direct(const Tile & t, int64_t n_blocks, const Activations<Format> & a, int64_t j0,
                                 typename V::F * acc) {
    typename V::F sum[RN];
    for (int j = 0; j < RN; ++j) {
        sum[j] = V::zerof();
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
        t.prefetch_next(b, 0, 2);
        if constexpr (RN <= stream_max<Format>::value && V::ROWS == TILE_ROWS) {
            if (t.interleaved) {
                Format::template stream_columns<RN>(t, b, a, j0, sum);
                t.prefetch_next(b, 1, 2);
                continue;
            }
        }
        typename Format::template PackedT<V> w;
        unpack_lanes<Format, V>(t, b, w);
        t.prefetch_next(b, 1, 2);
        accumulate_block<Format, RN, V>(w, a, b, j0, sum);
    }
    for (int j = 0; j < RN; ++j) {
        acc[j] = sum[j];
    }
}

// The same from a tile unpacked beforehand (batches wider than one pass unpack each tile once); the
// first pass prefetches the next tile (from the unpacking loop the prefetches came in one burst: B=1
// forced through this path took 17.6 ms instead of 9.7 for the Q8_0 SmolLM2 layers).
template <class Format, int RN, class V>
DFLASH_NOINLINE void tile_packed(const typename Format::template PackedT<V> * w, const Tile * prefetch,
                                 int64_t n_blocks, const Activations<Format> & a, int64_t j0, typename V::F * acc) {
    typename V::F sum[RN];
    for (int j = 0; j < RN; ++j) {
        sum[j] = V::zerof();
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
        if (prefetch != nullptr) {
            prefetch->prefetch_next(b);
        }
        accumulate_block<Format, RN, V>(w[b], a, b, j0, sum);
    }
    for (int j = 0; j < RN; ++j) {
        acc[j] = sum[j];
    }
}

// rn columns from j0 of one tile of 8 rows, row-wise (rn <= ROW_RN)
template <class Format>
void tile_rowwise_columns(int rn, const Tile & t, int64_t n_blocks, const Activations<Format> & a, int64_t j0,
                          __m256 * acc) {
    if constexpr (Format::ROWWISE_MAX > 0) {
        GGML_ASSERT(rn <= ROW_RN);
        if constexpr (Format::ROW_MAJOR) {
            switch (rn) {
                case 1: tile_row_major<Format, 1>(t, n_blocks, a, j0, acc); return;
                case 2: tile_row_major<Format, 2>(t, n_blocks, a, j0, acc); return;
                case 3: tile_row_major<Format, 3>(t, n_blocks, a, j0, acc); return;
                case 4: tile_row_major<Format, 4>(t, n_blocks, a, j0, acc); return;
                default: break;
            }
        } else {
            switch (rn) {
                case 1: tile_rows<Format, 1>(t, n_blocks, a, j0, acc); return;
                case 2: tile_rows<Format, 2>(t, n_blocks, a, j0, acc); return;
                case 3: tile_rows<Format, 3>(t, n_blocks, a, j0, acc); return;
                case 4: tile_rows<Format, 4>(t, n_blocks, a, j0, acc); return;
                default: break;
            }
        }
    }
    GGML_ABORT("dflash cpu gemm: %d row-wise columns per pass", rn);
}

// rn columns from j0 of one tile (V::ROWS rows) in lanes: straight from the weight rows (packed == nullptr,
// rn <= DIRECT_MAX) or from its unpacking (rn <= PACKED_RN)
template <class Format, class V>
void tile_lane_columns(int rn, const Tile & t, const typename Format::template PackedT<V> * packed,
                       int64_t n_blocks, const Activations<Format> & a, int64_t j0, typename V::F * acc) {
    if constexpr (Format::TILED) {
#define DFLASH_CPU_GEMM_CASE(RN) \
        case RN: packed ? tile_packed<Format, (RN <= PACKED_RN ? RN : 1), V>(packed, j0 == 0 ? &t : nullptr, \
                                                                             n_blocks, a, j0, acc) \
                        : tile_direct<Format, (RN <= DIRECT_MAX ? RN : 1), V>(t, n_blocks, a, j0, acc); break;
        GGML_ASSERT(rn <= (packed ? PACKED_RN : DIRECT_MAX));
        switch (rn) {
            DFLASH_CPU_GEMM_CASE(1)
            DFLASH_CPU_GEMM_CASE(2)
            DFLASH_CPU_GEMM_CASE(3)
            DFLASH_CPU_GEMM_CASE(4)
            DFLASH_CPU_GEMM_CASE(5)
            DFLASH_CPU_GEMM_CASE(6)
            DFLASH_CPU_GEMM_CASE(7)
            DFLASH_CPU_GEMM_CASE(8)
#if DFLASH_CPU_GEMM_DIRECT_MAX > 8 || DFLASH_CPU_GEMM_PACKED_RN > 8
            DFLASH_CPU_GEMM_CASE(9)
            DFLASH_CPU_GEMM_CASE(10)
            DFLASH_CPU_GEMM_CASE(11)
            DFLASH_CPU_GEMM_CASE(12)
            DFLASH_CPU_GEMM_CASE(13)
            DFLASH_CPU_GEMM_CASE(14)
            DFLASH_CPU_GEMM_CASE(15)
            DFLASH_CPU_GEMM_CASE(16)
#endif
            default: GGML_ABORT("dflash cpu gemm: %d columns per pass", rn);
        }
#undef DFLASH_CPU_GEMM_CASE
    } else {
        GGML_ABORT("dflash cpu gemm: no tiled kernel for this format");
    }
}

// Per-thread scratch of one format, reused across calls.
template <class Format>
struct Scratch {
    std::vector<int8_t> q;                             // activations, block-major
    std::vector<typename Format::Scale> scale;         // their scales, block-major
    std::vector<typename Format::Packed> packed;       // one tile unpacked (wide batches)
#if DFLASH_CPU_GEMM_V16
    std::vector<typename Format::template PackedT<V16>> packed16;   // the same, two tiles side by side
#endif
    std::vector<char> tail;                            // the last, partial tile padded to 8 rows
};

// All columns of one tile of V::ROWS rows (row r0 at tile.base) in lanes, written to C (its first `valid` rows)
template <class Format, class V>
void tile_in_lanes(const Tile & tile, int valid, int64_t n_blocks, int64_t n_cols, const Activations<Format> & a,
                   std::vector<typename Format::template PackedT<V>> & packed_scratch, float * C, int64_t ldc,
                   int64_t r0) {
    // one pass reads the weights directly; wider batches unpack each tile once and make several passes
    typename Format::template PackedT<V> * packed =
        n_cols > DIRECT_MAX ? grow(packed_scratch, (size_t) n_blocks) : nullptr;
    if (packed) {
        for (int64_t b = 0; b < n_blocks; ++b) {
            unpack_lanes<Format, V>(tile, b, packed[b]);
        }
    }
    const int pass = packed ? PACKED_RN : DIRECT_MAX;
    for (int64_t j0 = 0; j0 < n_cols; j0 += pass) {
        const int rn = (int) (n_cols - j0 < pass ? n_cols - j0 : pass);
        typename V::F acc[MAX_RN] = {};
        tile_lane_columns<Format, V>(rn, tile, packed, n_blocks, a, j0, acc);
        for (int j = 0; j < rn; ++j) {
            float * out = C + (j0 + j) * ldc + r0;
            if (valid == V::ROWS) {
                V::store(out, acc[j]);
            } else {
                alignas(64) float lanes[V::ROWS];
                V::store(lanes, acc[j]);
                memcpy(out, lanes, valid * sizeof(float));
            }
        }
    }
}

// Whether a product of n_cols columns steps two tiles at a time (formats with PAIR_TILES): from Format::PAIR_MIN_COLS
// columns where the core runs 512-bit dot steps at full rate, and for formats with PAIR_MIN_COLS_SPLIT_RATE from that
// many where it splits them (dflash_cpu_wide_k_tiles). Either way a column's sums are the same bits.
template <class Format, class = void>
struct pair_rule {
    static constexpr int64_t MIN_COLS = 1;
    static constexpr int64_t SPLIT_RATE_MIN_COLS = 1;
};
template <class Format>
struct pair_rule<Format, std::void_t<decltype(Format::PAIR_MIN_COLS_SPLIT_RATE)>> {
    static constexpr int64_t MIN_COLS = Format::PAIR_MIN_COLS;
    static constexpr int64_t SPLIT_RATE_MIN_COLS = Format::PAIR_MIN_COLS_SPLIT_RATE;
};
template <class Format>
bool pairs_wanted(int64_t n_cols) {
    using R = pair_rule<Format>;
    return n_cols >= R::SPLIT_RATE_MIN_COLS || (n_cols >= R::MIN_COLS && dflash_cpu_wide_k_tiles());
}

// Tiles tile0..tile1 of the product (tile_gemm), in order; the next tile is fetched ahead within the range, and
// after its last tile the rows at `after` (the first tile of the thread's next range, or nullptr)
template <class Format>
void tile_range(int64_t tile0, int64_t tile1, int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A,
                size_t a_row_bytes, const Activations<Format> & act, bool rowwise, bool interleaved, size_t row_data,
                Scratch<Format> & scratch, float * C, int64_t ldc, const char * after) {
#if DFLASH_CPU_GEMM_V16
    const bool pairs = !rowwise && pairs_wanted<Format>(n_cols);
#endif
    for (int64_t t = tile0; t < tile1;) {
        const int64_t r0 = t * TILE_ROWS;
        const int valid = (int) (n_rows - r0 < TILE_ROWS ? n_rows - r0 : TILE_ROWS);
#if DFLASH_CPU_GEMM_V16
        // two whole tiles of the range side by side (the next pair is fetched ahead; interleaved tiles lie one
        // after the other, so it is the next 16 rows either way)
        if constexpr (Format::TILED && Format::PAIR_TILES) {
            if (pairs && t + 1 < tile1 && r0 + 2 * TILE_ROWS <= n_rows) {
                const Tile pair{(const char *) A + r0 * a_row_bytes, a_row_bytes,
                                t + 2 < tile1 ? (const char *) A + (r0 + 2 * TILE_ROWS) * a_row_bytes : after,
                                2 * TILE_ROWS * a_row_bytes / n_blocks, interleaved};
                tile_in_lanes<Format, V16>(pair, V16::ROWS, n_blocks, n_cols, act, scratch.packed16, C, ldc, r0);
                t += 2;
                continue;
            }
        }
#endif
        Tile tile{(const char *) A + r0 * a_row_bytes, a_row_bytes,
                  t + 1 < tile1 ? (const char *) A + (r0 + TILE_ROWS) * a_row_bytes : after,
                  TILE_ROWS * a_row_bytes / n_blocks, interleaved};
        if (valid < TILE_ROWS) {   // pad with copies of the last row; their results are dropped
            char * pad = grow(scratch.tail, TILE_ROWS * row_data);
            for (int r = 0; r < TILE_ROWS; ++r) {
                memcpy(pad + r * row_data, tile.base + (r < valid ? r : valid - 1) * a_row_bytes, row_data);
            }
            tile.base = pad;
            tile.stride = row_data;
        }
        if (rowwise) {
            for (int64_t j0 = 0; j0 < n_cols; j0 += ROW_RN) {
                const int rn = (int) (n_cols - j0 < ROW_RN ? n_cols - j0 : ROW_RN);
                __m256 acc[ROW_RN];
                tile_rowwise_columns<Format>(rn, tile, n_blocks, act, j0, acc);
                for (int j = 0; j < rn; ++j) {
                    alignas(32) float lanes[TILE_ROWS];
                    _mm256_store_ps(lanes, acc[j]);
                    memcpy(C + (j0 + j) * ldc + r0, lanes, valid * sizeof(float));
                }
            }
        } else if constexpr (Format::TILED) {
            tile_in_lanes<Format, V8>(tile, valid, n_blocks, n_cols, act, scratch.packed, C, ldc, r0);
        } else {
            GGML_ABORT("dflash cpu gemm: no tiled kernel for this format");
        }
        ++t;
    }
}

// Rows are shared by chunks of whole tiles (gemm.h: dflash_cpu_next_chunk); threads that claim chunks get this many
// each on average, so one slowed down leaves little of the product to the others at the end. A thread claims its
// next chunk before it runs the current one, so that the next chunk's first tile is fetched ahead like any other
// (a chunk used to open on weights not yet fetched). 4 a thread before (2026-12-03), 16 since: on the ~2B Q4_K_M
// target at 2 threads the time threads waited for each other at the end of Q4_K products fell from ~5 % of their
// time to ~2 % and, in-process alternation (3 x 40 rounds), t(8) 0.96-0.98x, t(1) 0.97-0.99x; 16 without
// claiming ahead was slower (each chunk's first tile stalled), 32 no better than 16 (docs/cpu-kernels.md).
constexpr int64_t CHUNKS_PER_THREAD = 16;
// ... but at least this many tiles a chunk (while each thread gets one): a claim is an atomic add on a line both cores
// write, and SmolLM2's 576-row matrices (72 tiles) were claimed two tiles at a time, 32 claims a product. Emerald
// Rapids guest, 2 threads, SmolLM2 Q4_K_M (2026-12-05): a decode took 0.95x the time (mean of 10 alternating pairs of
// processes, 8 of them faster; the drafter's block likewise), and `bench` plain read higher in 7 of 8 alternating
// pairs. The ~2B shapes keep 16 chunks a thread (their products have 256 tiles or more).
constexpr int64_t MIN_CHUNK_TILES = 4;

// The whole product for one format; Format::column_scale gives each activation block's Format::Scale.
// interleaved: A's tiles of 8 rows word-interleaved (n_rows a multiple of 8; formats whose unpacking reads them:
// TileRows for the K-quants, Q4_0::unpack)
template <class Format>
void tile_gemm(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A, size_t a_row_bytes,
               const void * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth,
               dflash_cpu_next_chunk next_chunk, void * pool, bool interleaved) {
    static thread_local Scratch<Format> scratch;

    const int64_t n_tiles = (n_rows + TILE_ROWS - 1) / TILE_ROWS;
    const bool claiming = next_chunk != nullptr && nth > 1;
    const int64_t n_chunks = claiming ? std::max(std::min(n_tiles, (int64_t) nth),
                                                 std::min(n_tiles / MIN_CHUNK_TILES, CHUNKS_PER_THREAD * nth))
                                      : nth;
    if (ith >= n_chunks || n_tiles * ith / n_chunks >= n_tiles * (ith + 1) / n_chunks) {
        return;
    }
    using Scale = typename Format::Scale;
    constexpr int64_t QK = Activations<Format>::QK;
    static_assert(QK % QK8_0 == 0, "activation blocks of whole groups of 32");
    int8_t * q = grow(scratch.q, (size_t) (n_blocks * n_cols * QK));
    Scale * scale = grow(scratch.scale, (size_t) (n_blocks * n_cols));
    for (int64_t j = 0; j < n_cols; ++j) {
        const auto * y = (const typename Format::ActBlock *) ((const char *) B + j * b_row_bytes);
        for (int64_t b = 0; b < n_blocks; ++b) {
            memcpy(q + (b * n_cols + j) * QK, y[b].qs, QK);
            scale[b * n_cols + j] = Format::column_scale(y[b]);
        }
    }
    const Activations<Format> act{q, scale, n_cols};
    // an interleaved tile has no rows to read one after the other: every width in lanes
    const bool rowwise = !interleaved && n_cols <= Format::ROWWISE_MAX;
    GGML_ASSERT(!interleaved || (Format::TILED && n_rows % TILE_ROWS == 0));
    const size_t row_data = n_blocks * sizeof(typename Format::Block);

    const auto first_tile = [&](int64_t chunk) { return n_tiles * chunk / n_chunks; };
    int64_t chunk = ith;
    int64_t next = claiming ? next_chunk(pool) : n_chunks;
    while (chunk < n_chunks) {
        const char * after = next < n_chunks ? (const char *) A + first_tile(next) * TILE_ROWS * a_row_bytes : nullptr;
        tile_range(first_tile(chunk), first_tile(chunk + 1), n_rows, n_cols, n_blocks, A, a_row_bytes, act, rowwise,
                   interleaved, row_data, scratch, C, ldc, after);
        chunk = next;
        next = claiming && chunk < n_chunks ? next_chunk(pool) : n_chunks;
    }
}

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu

// One entry point of isa.h (inside namespace dflash_cpu::DFLASH_CPU_VARIANT): the whole product for Format, or
// false where this variant has no x86 kernels (Format is then not defined and not named)
#if DFLASH_CPU_GEMM_X86
#define DFLASH_CPU_GEMM_ENTRY(name, Format)                                                                       \
    bool name(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A, size_t a_row_bytes,             \
              const void * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth,                     \
              dflash_cpu_next_chunk next_chunk, void * pool) {                                                  \
        tile_gemm<Format>(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth, next_chunk, \
                          pool, false);                                                                         \
        return true;                                                                                          \
    }                                                                                                         \
    bool name##_interleaved(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A, size_t a_row_bytes, \
                            const void * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth,     \
                            dflash_cpu_next_chunk next_chunk, void * pool) {                                  \
        if constexpr (Format::TILED) {                                                                        \
            tile_gemm<Format>(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth,     \
                              next_chunk, pool, true);                                                        \
            return true;                                                                                      \
        }                                                                                                     \
        return false;                                                                                         \
    }
#else
#define DFLASH_CPU_GEMM_ENTRY(name, Format)                                                                       \
    bool name(int64_t, int64_t, int64_t, const void *, size_t, const void *, size_t, float *, int64_t, int, int,   \
              dflash_cpu_next_chunk, void *) {                                                                  \
        return false;                                                                                         \
    }                                                                                                         \
    bool name##_interleaved(int64_t, int64_t, int64_t, const void *, size_t, const void *, size_t, float *,    \
                            int64_t, int, int, dflash_cpu_next_chunk, void *) {                               \
        return false;                                                                                         \
    }
#endif
