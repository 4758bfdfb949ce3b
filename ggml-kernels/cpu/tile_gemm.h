// dflash-gguf: the shared x86 skeleton of our CPU matrix multiplies (internal to ggml-kernels/cpu).
//
// Compiled once per instruction set (CMake: -DDFLASH_CPU_VARIANT=avx2 or avx512, see isa.h); the
// kernels land in namespace dflash_cpu::<variant> and gemm.cpp picks one at run time.
//
// A weight format describes one block of 32 weights of a row as w = d * q + m with q unsigned
// (Q4_1: q in 0..15 and its min m; Q8_0: q + 128 in 1..255 and m = -128 d), and activations as
// a = d_a * p with p in -127..127. Then per block
//   sum(w * a) = d * d_a * sum(q * p) + m * d_a * sum(p)
// with sum(q * p) exact in integers. The format supplies the unpacking of a block of 8 rows into
// lanes (PackedBlock, TILED formats) or the integer sums of 8 untransposed rows (dot_rows, up to
// ROWWISE_MAX columns), and how the min term is added; the rest, including the one float step per
// block that every path shares (block_fma), is here.
#pragma once

#include "isa.h"

#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"

#include <cstring>
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
constexpr int MAX_RN = DIRECT_MAX > PACKED_RN ? DIRECT_MAX : PACKED_RN;

DFLASH_INLINE uint32_t load_u32(const void * p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

// One block of a tile of 8 weight rows, transposed: lane r of q[g] holds the 4 unsigned quants of
// row r at positions 4g..4g+3 of the block, so one dot step against 4 activation bytes broadcast to
// all lanes advances all 8 rows at once and the result needs no horizontal sum.
struct alignas(32) PackedBlock {
    __m256i q[8];
    __m256 d;      // scale of each row's block
    __m256 m;      // min of each row's block (formats with a min term only)
};

struct ColumnScale {
    float d;       // d_a of an activation block
    float s;       // d_a * sum(p), for formats whose min term is a float FMA (Q4_1)
    int32_t bias;  // 128 * sum(p), for formats whose min term is exact in integers (Q8_0)
};

// The batch's activations re-laid block-major, so that the inner loop walks two pointers with
// constant offsets instead of one pointer per column.
struct Activations {
    const int8_t * q;            // [n_blocks][n_cols][32]
    const ColumnScale * scale;   // [n_blocks][n_cols]
    int64_t n_cols;
};

// 8 weight rows at a constant stride (the last, partial tile of a matrix is a padded copy).
struct Tile {
    const char * base;     // row 0
    size_t stride;         // bytes from one row to the next
    const char * next;     // first byte of the thread's next tile, or nullptr
    size_t next_step;      // bytes of the next tile to prefetch per block

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
    // prefetching 2 or 4 tiles ahead or into L2 only (T1/T2) was not better.
    DFLASH_INLINE void prefetch_next(int64_t b) const {
        if (next != nullptr) {
            const char * p = next + b * next_step;
            for (size_t off = 0; off < next_step + 63; off += 64) {
                _mm_prefetch(p + off, _MM_HINT_T0);
            }
        }
    }
};

// sum over the block of q * p for the 8 rows of a packed block and 32 activation quants p
DFLASH_INLINE __m256i dot_block(const PackedBlock & w, const int8_t * p) {
#if DFLASH_CPU_GEMM_VNNI
    __m256i even = _mm256_setzero_si256();
    __m256i odd = _mm256_setzero_si256();
    for (int k = 0; k < 8; k += 2) {
        even = DFLASH_DPBUSD(even, w.q[k],     _mm256_set1_epi32((int) load_u32(p + 4 * k)));
        odd  = DFLASH_DPBUSD(odd,  w.q[k + 1], _mm256_set1_epi32((int) load_u32(p + 4 * k + 4)));
    }
    return _mm256_add_epi32(even, odd);
#else
    // 4-bit q only: int16 partial sums |q*p + q*p| <= 2*15*127 = 3810, 8 steps <= 30480 < 32767
    __m256i s[8];
    for (int k = 0; k < 8; ++k) {
        s[k] = _mm256_maddubs_epi16(w.q[k], _mm256_set1_epi32((int) load_u32(p + 4 * k)));
    }
    const __m256i s16 = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(s[0], s[1]), _mm256_add_epi16(s[2], s[3])),
                                         _mm256_add_epi16(_mm256_add_epi16(s[4], s[5]), _mm256_add_epi16(s[6], s[7])));
    return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
#endif
}

// The float step every kernel of a format shares, whatever computed the exact integer block sums:
// acc += isum * (d * d_a) [+ m * s]. Keeping this sequence (and the block order) fixed per output
// makes a column's result independent of the batch width and of the instruction set that produced
// isum: integer sums are exact, so only these roundings count.
template <class Format>
DFLASH_INLINE __m256 block_fma(__m256i isum, __m256 d, __m256 m, const ColumnScale & c, __m256 acc) {
    const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(c.d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc);
    if (Format::FLOAT_MIN) {
        acc = _mm256_fmadd_ps(m, _mm256_set1_ps(c.s), acc);
    }
    return acc;
}

// acc[j] += one weight block (8 rows) times block b of activation columns j0 + j, j < RN
template <class Format, int RN>
DFLASH_INLINE void accumulate_block(const PackedBlock & w, const Activations & a, int64_t b, int64_t j0,
                                    __m256 * acc) {
    const int8_t * q = a.q + (b * a.n_cols + j0) * QK8_0;
    const ColumnScale * scale = a.scale + b * a.n_cols + j0;
    for (int j = 0; j < RN; ++j) {
        __m256i isum = dot_block(w, q + j * QK8_0);
        if (!Format::FLOAT_MIN) {
            isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(scale[j].bias));
        }
        acc[j] = block_fma<Format>(isum, w.d, w.m, scale[j], acc[j]);
    }
}

// Columns j0..j0+RN of one tile without transposing it (widths up to Format::ROWWISE_MAX, see q8_0_gemm.cpp):
// per block, Format::dot_rows gives the exact integer sums of the 8 rows for one column.
template <class Format, int RN>
DFLASH_NOINLINE void tile_rows(const Tile & t, int64_t n_blocks, const Activations & a, int64_t j0, __m256 * acc) {
    __m256 sum[RN];
    for (int j = 0; j < RN; ++j) {
        sum[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
        t.prefetch_next(b);
        const typename Format::Block * r[TILE_ROWS];
        t.rows(b, r);
        const __m256 d = Format::row_scales(r);
        const int8_t * q = a.q + (b * a.n_cols + j0) * QK8_0;
        const ColumnScale * scale = a.scale + b * a.n_cols + j0;
        for (int j = 0; j < RN; ++j) {
            const __m256i isum = Format::dot_rows(r, q + j * QK8_0, scale[j]);
            sum[j] = block_fma<Format>(isum, d, _mm256_setzero_ps(), scale[j], sum[j]);
        }
    }
    for (int j = 0; j < RN; ++j) {
        acc[j] = sum[j];
    }
}

// Columns j0..j0+RN of one tile, straight from the weight rows: acc[j] lane r = row r . column j0+j.
template <class Format, int RN>
DFLASH_NOINLINE void tile_direct(const Tile & t, int64_t n_blocks, const Activations & a, int64_t j0,
                                 __m256 * acc) {
    __m256 sum[RN];
    for (int j = 0; j < RN; ++j) {
        sum[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
        t.prefetch_next(b);
        PackedBlock w;
        Format::unpack(t, b, w);
        accumulate_block<Format, RN>(w, a, b, j0, sum);
    }
    for (int j = 0; j < RN; ++j) {
        acc[j] = sum[j];
    }
}

// The same from a tile unpacked beforehand (batches wider than one pass unpack each tile once); the
// first pass prefetches the next tile (from the unpacking loop the prefetches came in one burst: B=1
// forced through this path took 17.6 ms instead of 9.7 for the Q8_0 SmolLM2 layers).
template <class Format, int RN>
DFLASH_NOINLINE void tile_packed(const PackedBlock * w, const Tile * prefetch, int64_t n_blocks,
                                 const Activations & a, int64_t j0, __m256 * acc) {
    __m256 sum[RN];
    for (int j = 0; j < RN; ++j) {
        sum[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
        if (prefetch != nullptr) {
            prefetch->prefetch_next(b);
        }
        accumulate_block<Format, RN>(w[b], a, b, j0, sum);
    }
    for (int j = 0; j < RN; ++j) {
        acc[j] = sum[j];
    }
}

// rn columns from j0 of one tile: row-wise (rowwise, rn <= ROW_RN), straight from the weight rows
// (packed == nullptr, rn <= DIRECT_MAX) or from its unpacking (rn <= PACKED_RN)
template <class Format>
void tile_columns(int rn, bool rowwise, const Tile & t, const PackedBlock * packed, int64_t n_blocks,
                  const Activations & a, int64_t j0, __m256 * acc) {
    if constexpr (Format::ROWWISE_MAX > 0) {
        if (rowwise) {
            GGML_ASSERT(rn <= ROW_RN);
            switch (rn) {
                case 1: tile_rows<Format, 1>(t, n_blocks, a, j0, acc); return;
                case 2: tile_rows<Format, 2>(t, n_blocks, a, j0, acc); return;
                case 3: tile_rows<Format, 3>(t, n_blocks, a, j0, acc); return;
                case 4: tile_rows<Format, 4>(t, n_blocks, a, j0, acc); return;
                default: GGML_ABORT("dflash cpu gemm: %d row-wise columns per pass", rn);
            }
        }
    }
    if constexpr (Format::TILED) {
#define DFLASH_CPU_GEMM_CASE(RN) \
        case RN: packed ? tile_packed<Format, (RN <= PACKED_RN ? RN : 1)>(packed, j0 == 0 ? &t : nullptr, \
                                                                          n_blocks, a, j0, acc) \
                        : tile_direct<Format, (RN <= DIRECT_MAX ? RN : 1)>(t, n_blocks, a, j0, acc); break;
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

template <typename T>
T * grow(std::vector<T> & v, size_t n) {
    if (v.size() < n) {
        v.resize(n);
    }
    return v.data();
}

// Per-thread scratch, reused across calls.
struct Scratch {
    std::vector<int8_t> q;                 // activations, block-major
    std::vector<ColumnScale> scale;
    std::vector<PackedBlock> packed;       // one tile unpacked (wide batches)
    std::vector<char> tail;                // the last, partial tile padded to 8 rows
};

// The whole product for one format; Format::relayout fills the block-major activations.
template <class Format>
void tile_gemm(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A, size_t a_row_bytes,
               const void * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth) {
    static thread_local Scratch scratch;

    const int64_t n_tiles = (n_rows + TILE_ROWS - 1) / TILE_ROWS;
    const int64_t tile0 = n_tiles * ith / nth;
    const int64_t tile1 = n_tiles * (ith + 1) / nth;
    if (tile0 >= tile1) {
        return;
    }
    int8_t * q = grow(scratch.q, (size_t) (n_blocks * n_cols * QK8_0));
    ColumnScale * scale = grow(scratch.scale, (size_t) (n_blocks * n_cols));
    for (int64_t j = 0; j < n_cols; ++j) {
        const auto * y = (const typename Format::ActBlock *) ((const char *) B + j * b_row_bytes);
        for (int64_t b = 0; b < n_blocks; ++b) {
            memcpy(q + (b * n_cols + j) * QK8_0, y[b].qs, QK8_0);
            scale[b * n_cols + j] = Format::column_scale(y[b]);
        }
    }
    const Activations act{q, scale, n_cols};
    // row-wise where the format asks for it; otherwise one pass reads the weights directly, and wider
    // batches unpack each tile once and make several passes
    const bool rowwise = n_cols <= Format::ROWWISE_MAX;
    PackedBlock * packed = !rowwise && n_cols > DIRECT_MAX ? grow(scratch.packed, (size_t) n_blocks) : nullptr;
    const int pass = rowwise ? ROW_RN : packed ? PACKED_RN : DIRECT_MAX;
    const size_t row_data = n_blocks * sizeof(typename Format::Block);

    for (int64_t t = tile0; t < tile1; ++t) {
        const int64_t r0 = t * TILE_ROWS;
        const int valid = (int) (n_rows - r0 < TILE_ROWS ? n_rows - r0 : TILE_ROWS);
        Tile tile{(const char *) A + r0 * a_row_bytes, a_row_bytes,
                  t + 1 < tile1 ? (const char *) A + (r0 + TILE_ROWS) * a_row_bytes : nullptr,
                  TILE_ROWS * a_row_bytes / n_blocks};
        if (valid < TILE_ROWS) {   // pad with copies of the last row; their results are dropped
            char * pad = grow(scratch.tail, TILE_ROWS * row_data);
            for (int r = 0; r < TILE_ROWS; ++r) {
                memcpy(pad + r * row_data, tile.base + (r < valid ? r : valid - 1) * a_row_bytes, row_data);
            }
            tile.base = pad;
            tile.stride = row_data;
        }
        if constexpr (Format::TILED) {
            if (packed) {
                for (int64_t b = 0; b < n_blocks; ++b) {
                    Format::unpack(tile, b, packed[b]);
                }
            }
        }
        for (int64_t j0 = 0; j0 < n_cols; j0 += pass) {
            const int rn = (int) (n_cols - j0 < pass ? n_cols - j0 : pass);
            __m256 acc[MAX_RN];
            tile_columns<Format>(rn, rowwise, tile, packed, n_blocks, act, j0, acc);
            for (int j = 0; j < rn; ++j) {
                float * out = C + (j0 + j) * ldc + r0;
                if (valid == TILE_ROWS) {
                    _mm256_storeu_ps(out, acc[j]);
                } else {
                    alignas(32) float lanes[TILE_ROWS];
                    _mm256_store_ps(lanes, acc[j]);
                    memcpy(out, lanes, valid * sizeof(float));
                }
            }
        }
    }
}

}  // namespace

#endif  // DFLASH_CPU_GEMM_X86

}  // namespace DFLASH_CPU_VARIANT
}  // namespace dflash_cpu
