// dflash-gguf: quantized weight x activation matrix multiplies for ggml's CPU backend (x86).
//
// ggml-cpu multiplies Q4_1 weights by a separate vec_dot per (row, column) pair, decoding each weight
// block again for every column (no tinyBLAS or repack path: Q4_1's per-block min pairs with the
// s = d*sum(q) of Q8_1 activations), and its tinyBLAS path for Q8_0 costs 3-4x a single row already at
// 2 columns. These kernels decode a tile of 8 weight rows once per block, transposed so that vector
// lane r holds row r, and reuse it for every column: per column and block 8 integer dot steps plus a
// scale FMA cover all 8 rows, with no horizontal sums (tile_gemm.h).
#pragma once

#include "ggml.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Whether a kernel for weights of `type` is compiled in for this CPU and measured faster than ggml's
// own path for a batch of n_cols activation columns (the rule and its measurements: gemm.cpp).
bool dflash_cpu_gemm_wanted(enum ggml_type type, int64_t n_cols);

// C[j*ldc + i] = dot(row i of A, row j of B) for i < n_rows, j < n_cols. A: n_rows rows of n_blocks
// blocks of `type` (row stride a_row_bytes); B: n_cols rows of n_blocks blocks of that type's
// vec_dot_type (Q8_1 for Q4_1, Q8_0 for Q8_0; row stride b_row_bytes); C: float, column stride ldc
// floats. Thread ith of nth computes its share of the rows; together they cover all of them.
// Returns false (and writes nothing) when no kernel for `type` is compiled in.
bool dflash_cpu_gemm(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t n_blocks,
                     const void * A, size_t a_row_bytes, const void * B, size_t b_row_bytes,
                     float * C, int64_t ldc, int ith, int nth);

#ifdef __cplusplus
}
#endif
