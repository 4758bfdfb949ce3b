// dflash-gguf: which weight types and batch widths go to our CPU kernels (see gemm.h).

#include "gemm.h"

#include "tile_gemm.h"

// Measured against ggml's own path: ggml_graph_compute of the 210 matrices of SmolLM2-135M (30 layers,
// streamed from memory), one thread, thread CPU time, medians of 3-5 runs; ours / ggml's time.
//
// Q4_1 (ggml: vec_dot per row and column) -- every batch width:
//   AVX512-VNNI (Zen 4, -march=native): B=1 0.55-0.75, B=2 0.34, B=4 0.26, B=8 0.21, B=16 0.19, B=512 0.20
//   AVX2 build (-mavx2 -mfma -mf16c):   B=1 0.71,      B=2 0.39, B=4 0.31, B=8 0.27, B=16 0.29
//
// Q8_0 (ggml: vec_dot at B=1, tinyBLAS above) -- VNNI only, from 2 columns:
//   AVX512-VNNI: B=1 1.09-1.27 (memory-bound; stays with vec_dot), B=2 0.34, B=3 0.30, B=4 0.32,
//                B=8 0.34, B=12 0.37, B=16 0.39, B=64 0.48
extern "C" bool dflash_cpu_gemm_wanted(enum ggml_type type, int64_t n_cols) {
    switch (type) {
#if DFLASH_CPU_GEMM_X86
        case GGML_TYPE_Q4_1:
            return n_cols >= 1;
#endif
#if DFLASH_CPU_GEMM_VNNI
        case GGML_TYPE_Q8_0:
            return n_cols >= 2;
#endif
        default:
            (void) n_cols;
            return false;
    }
}

extern "C" bool dflash_cpu_gemm(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t n_blocks,
                                const void * A, size_t a_row_bytes, const void * B, size_t b_row_bytes,
                                float * C, int64_t ldc, int ith, int nth) {
    switch (type) {
        case GGML_TYPE_Q4_1:
            return dflash_cpu::gemm_q4_1(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth);
        case GGML_TYPE_Q8_0:
            return dflash_cpu::gemm_q8_0(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth);
        default:
            return false;
    }
}
