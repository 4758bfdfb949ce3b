// dflash-gguf: weight x activation matrix multiplies for ggml's CPU backend (x86).
//
// Batch invariance: every kernel here computes an output (weight row i, activation column j) with a
// summation order that does not depend on how many columns the product has, and the dispatch sends
// every width of a covered type (one column too) to the same kernel family. So the logits of a row of
// a verify batch equal, bit for bit, those of the same token decoded alone (tests/test_cpu_kernels.py,
// tests/test_exactness.py). Covered: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS,
// IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M (quantized activations, tile_gemm.h), F16, BF16, F32
// (float_gemm.cpp). Other types (TQ1_0, TQ2_0, MXFP4, NVFP4) take ggml's
// width-independent paths (dflash_cpu_batch_invariant).
//
// Speed: ggml-cpu multiplies Q4_1 weights by a separate vec_dot per (row, column) pair, decoding each
// weight block again for every column, and its tinyBLAS path for Q8_0 costs 3-4x a single row already
// at 2 columns. The quantized kernels decode a tile of 8 weight rows once per block, transposed so
// that vector lane r holds row r, and reuse it for every column (tile_gemm.h).
#pragma once

#include "ggml.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Whether our kernels take a product of weights of `type` with n_cols activation columns on this CPU
// (the rule and its measurements: gemm.cpp). F16, BF16 and F32 weights go to dflash_cpu_gemm_f32_act, the
// quantized types to dflash_cpu_gemm.
bool dflash_cpu_gemm_wanted(enum ggml_type type, int64_t n_cols);

// How the nth threads of one product share its rows. Thread ith first computes chunk ith of them; with next_chunk
// it then goes on with the chunk next_chunk(pool) returns, until that is past the last one (pool: a counter shared
// by the product's threads that starts at nth, as ggml's threadpool chunk counter does), so a thread slowed by
// anything else computes less of the product instead of keeping the others waiting. Without it (NULL) the rows
// are nth equal chunks. Which thread computes a row does not change its bits.
typedef int (*dflash_cpu_next_chunk)(void * pool);

// C[j*ldc + i] = dot(row i of A, row j of B) for i < n_rows, j < n_cols. A: n_rows rows of n_blocks
// blocks of `type` (row stride a_row_bytes); B: n_cols rows of n_blocks blocks of that type's
// vec_dot_type (Q8_1 for Q4_1 and Q5_1, Q8_K for the K-quants, Q8_0 for the others; row stride b_row_bytes); C: float,
// column stride ldc floats. Thread ith of nth computes its share of the rows (dflash_cpu_next_chunk); together
// they cover all of them. Returns false (and writes nothing) when no kernel for `type` runs on this CPU.
bool dflash_cpu_gemm(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t n_blocks,
                     const void * A, size_t a_row_bytes, const void * B, size_t b_row_bytes,
                     float * C, int64_t ldc, int ith, int nth, dflash_cpu_next_chunk next_chunk, void * pool);

// Interleaved weights: the types whose kernels read a tile of 8 rows fastest as one stream of words (Q4_K and Q5_K:
// without the per-call transposes, one column took 0.67x and 8 columns 0.77x the time in ggml's row layout; Q6_K:
// with VNNI 0.86-0.97x at 1 column and 0.86-0.93x at 4 to 16, native AVX2 (Zen 3) 0.93-1.00x at 1 in four runs of
// five (1.06x in one) and 0.90-0.92x at 2 and 8 (forced AVX2 on Zen 4 had read 1.04-1.07x at 1 column);
// Q2_K and Q3_K, every ISA: 0.84-0.94x at 1 column and 0.78-0.99x at 8 on the ~2B shape; Q4_0: docs/cpu-kernels.md;
// Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL; the lattice IQ types IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) are kept, from load,
// with each block of each tile of 8 rows stored as its 4-byte words, word w of row r at 32 w + 4 r; a block that opens
// with one fp16 scale before whole words (Q4_0, Q5_0, Q8_0, IQ4_NL, the lattice types) keeps the 8 rows' scales
// first, 16 bytes, and its words after them, at 16 + 32 w + 4 r; one that closes
// with its fp16 d (Q6_K after 52 words, Q3_K after 27) keeps its words first and the 8 rows' d after them, row r's at
// 32 * words + 2 r (the bytes of 8 rows; the rows' order within a block changes, nothing else, but for
// three types: Q8_0's quants are stored as q + 128, and the 8 rows' fifth bits of Q5_0 (its word 0, at 16) and Q5_1
// (word 1, at 32) in the lanes their unpacking fills: as bit planes, byte 4 r + i holding bit 4 k + i of row r's fifth
// bits at bit k (Q5_1 always, Q5_0 where dflash_cpu_q5_0_bit_planes() says so), otherwise (Q5_0) as 8 masks, mask k at
// 16 + 4 k holding that bit at bit 4 r + i). ggml-cpu's repack buffer keeps them so (patches/0014).
// Which of the two Q5_0 takes on this CPU (one answer per process: bit planes unless the best variant is AVX-512's):
bool dflash_cpu_q5_0_bit_planes(void);
// Whether weights of `type` with n_rows rows (a 2-D matrix) are kept that way on this CPU:
bool dflash_cpu_interleave_wanted(enum ggml_type type, int64_t n_rows);

// Write n_rows rows of `type` (row_bytes each; n_rows a multiple of 8) from src to dst interleaved.
void dflash_cpu_interleave(enum ggml_type type, int64_t n_rows, size_t row_bytes, const void * src, void * dst);

// dflash_cpu_gemm on interleaved weights (A as dflash_cpu_interleave wrote it; a_row_bytes the rows' size). The
// bits equal dflash_cpu_gemm's on the same weights in ggml's layout at every width. Runs where the kernels are
// switched off after the weights were interleaved too (DFLASH_CPU_ISA=none set at run time: nothing else reads them).
bool dflash_cpu_gemm_interleaved(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t n_blocks,
                                 const void * A, size_t a_row_bytes, const void * B, size_t b_row_bytes,
                                 float * C, int64_t ldc, int ith, int nth, dflash_cpu_next_chunk next_chunk,
                                 void * pool);

// Whether weights of `type` are floats our kernels multiply by F32 activations read in place: F16, BF16, F32
bool dflash_cpu_float_weights(enum ggml_type type);

// The same for F16 / BF16 / F32 weights of k values per row and F32 activations read in place (B: n_cols
// rows of k floats, row stride b_row_bytes).
bool dflash_cpu_gemm_f32_act(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t k,
                             const void * A, size_t a_row_bytes, const float * B, size_t b_row_bytes,
                             float * C, int64_t ldc, int ith, int nth);

// Whether the weight types our kernels do not cover are kept batch invariant too: ggml's vec_dot per
// (row, column) instead of tinyBLAS and of the tiled K-quant matmul (8 columns and up), and repacked
// weights (Q4_0, Q4_K, IQ4_NL, ... on AVX2) through gemv for every column instead of the 4-column gemm
// (patches/0010-cpu-batch-invariant-fallbacks.patch). On
// unless ggml's own paths were asked for by name (DFLASH_CPU_ISA=none, dflash_cpu_set_isa("none")), on
// CPUs without our kernels too.
// Q8_K activations (the K-quants' vec_dot_type) bit for bit as quantize_row_q8_K_ref writes them, in vector
// steps; false (nothing written) where the kernels are off (DFLASH_CPU_ISA=none keeps ggml's scalar one)
bool dflash_cpu_quantize_row_q8_K(const float * x, void * y, int64_t k);

bool dflash_cpu_batch_invariant(void);

// Bytes of the work buffer flash attention's split takes beyond its threads' scratch (defined in patches/0012's
// ops.cpp): the softmax states of each chunk of a row's positions, when the threads split a row's positions; 0
// where it never splits that op.
size_t dflash_fa_rows_split_wsize(const struct ggml_tensor * dst);

// Whether the AVX-512 variant steps the K-quants' tiles (Q4_K, Q5_K, Q6_K, IQ4_XS) two at a time, 16 rows in a
// __m512, for batches of 4 columns and more. Chosen at first use: on where the core runs 512-bit dot steps as fast as
// 256-bit ones (two 512-bit units: Intel Xeon Scalable; 8 columns of Q4_K 0.53x the time of 8-row tiles on an Emerald
// Rapids core), off where a 512-bit step takes about twice as long (a core that splits it in two; on Zen 4, before this
// choice existed, 16-row K tiles measured no faster: docs/cpu-kernels.md). DFLASH_CPU_WIDE_K_TILES=1 or 0 decides
// instead. The bits are the same either way.
bool dflash_cpu_wide_k_tiles(void);
// Decide it: 1 on, 0 off, -1 as chosen at first use. Call between graph computations.
void dflash_cpu_set_wide_k_tiles(int on);
// The instruction-set variant our kernels run with: "avx512", "avx2" or "none" (ggml's own paths).
// Chosen at first use from the CPU, unless the environment variable DFLASH_CPU_ISA names one
// ("avx2" on an AVX-512 machine runs what AVX2-only machines run).
const char * dflash_cpu_isa(void);

// Switch the variant ("auto", "avx512", "avx2", "none"); false (and no change) when this CPU cannot
// run it. Call between graph computations.
bool dflash_cpu_set_isa(const char * isa);

#ifdef __cplusplus
}
#endif
