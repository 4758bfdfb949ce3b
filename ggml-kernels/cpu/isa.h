// dflash-gguf: the entry points of one instruction-set variant of our CPU kernels (internal).
//
// Each kernel source is compiled three times (patches/0003, CMake): with -DDFLASH_CPU_VARIANT=avx2 and
// AVX2/FMA/F16C only (AVX-512 and AVX-VNNI off), with -DDFLASH_CPU_VARIANT=avxvnni and AVX-VNNI on top (256-bit
// vpdpbusd, Intel's cores without AVX-512 since Alder Lake), and with -DDFLASH_CPU_VARIANT=avx512 and AVX-512
// F/BW/VL/VNNI on. gemm.cpp checks the CPU at run time and calls one of them, so an AVX-512 machine can also run
// (and test) exactly what an AVX2-only or AVX-VNNI machine runs.
#pragma once

#include "gemm.h"

#include <stddef.h>
#include <stdint.h>

// quantized weights x activations converted to their vec_dot_type (gemm.h: dflash_cpu_gemm)
// (name_interleaved: A's tiles of 8 rows word-interleaved, gemm.h: dflash_cpu_gemm_interleaved)
#define DFLASH_CPU_QUANT_GEMM(name)                                                                               \
    bool name(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A, size_t a_row_bytes,             \
              const void * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, int nth,                     \
              dflash_cpu_next_chunk next_chunk, void * pool);                                                   \
    bool name##_interleaved(int64_t n_rows, int64_t n_cols, int64_t n_blocks, const void * A,                   \
                            size_t a_row_bytes, const void * B, size_t b_row_bytes, float * C, int64_t ldc,     \
                            int ith, int nth, dflash_cpu_next_chunk next_chunk, void * pool);

#define DFLASH_CPU_VARIANT_ENTRY_POINTS                                                                        \
    DFLASH_CPU_QUANT_GEMM(gemm_q4_0)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_q4_1)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_q5_0)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_q5_1)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_q8_0)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_iq4_nl)                                                                         \
    DFLASH_CPU_QUANT_GEMM(gemm_q4_k)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_q5_k)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_q6_k)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_q3_k)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_q2_k)                                                                           \
    DFLASH_CPU_QUANT_GEMM(gemm_iq4_xs)                                                                         \
    DFLASH_CPU_QUANT_GEMM(gemm_iq3_xxs)                                                                        \
    DFLASH_CPU_QUANT_GEMM(gemm_iq3_s)                                                                          \
    DFLASH_CPU_QUANT_GEMM(gemm_iq2_xxs)                                                                        \
    DFLASH_CPU_QUANT_GEMM(gemm_iq2_xs)                                                                         \
    DFLASH_CPU_QUANT_GEMM(gemm_iq2_s)                                                                          \
    DFLASH_CPU_QUANT_GEMM(gemm_iq1_s)                                                                          \
    DFLASH_CPU_QUANT_GEMM(gemm_iq1_m)                                                                          \
    /* activations of the K-quants, as ggml's quantize_row_q8_K_ref writes them (gemm.h) */                 \
    bool quantize_q8_k(const float * x, void * y, int64_t k);                                                 \
    /* whether this core runs 512-bit dot steps as fast as 256-bit ones (false where the variant has none) */  \
    bool full_rate_512(void);                                                                                  \
    /* F16 / F32 weights x F32 activations (gemm.h: dflash_cpu_gemm_f32_act) */                              \
    bool gemm_float(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t k, const void * A,           \
                    size_t a_row_bytes, const float * B, size_t b_row_bytes, float * C, int64_t ldc, int ith, \
                    int nth);

namespace dflash_cpu {
namespace avx2 {
DFLASH_CPU_VARIANT_ENTRY_POINTS
}
namespace avxvnni {
DFLASH_CPU_VARIANT_ENTRY_POINTS
}
namespace avx512 {
DFLASH_CPU_VARIANT_ENTRY_POINTS
}
}  // namespace dflash_cpu
