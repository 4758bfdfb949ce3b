// dflash-gguf: which weight types and batch widths go to our CPU kernels, and which instruction-set
// variant runs them (see gemm.h, isa.h).

#include "gemm.h"

#include "isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

// DFLASH_CPU_VARIANTS: set by the build where it compiled the avx2 and avx512 variants (x86, GCC/Clang)
#if DFLASH_CPU_VARIANTS
#include <cpuid.h>
#endif

namespace {

enum Isa { ISA_UNSET = -1, ISA_NONE = 0, ISA_AVX2 = 1, ISA_AVXVNNI = 2, ISA_AVX512 = 3 };

const char * const ISA_NAMES[] = {"none", "avx2", "avxvnni", "avx512"};
constexpr int N_ISAS = sizeof ISA_NAMES / sizeof ISA_NAMES[0];

bool cpu_runs(Isa isa) {
#if DFLASH_CPU_VARIANTS
    if (isa == ISA_NONE) {
        return true;
    }
    unsigned a, b, c, d;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (isa == ISA_AVX2) {
        return avx2;
    }
    if (isa == ISA_AVXVNNI) {   // AVX-VNNI: 256-bit vpdpbusd without AVX-512 (Intel since Alder Lake)
        return avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
    }
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
    return isa == ISA_NONE;
#endif
}

Isa best_isa() {
    return cpu_runs(ISA_AVX512)    ? ISA_AVX512
           : cpu_runs(ISA_AVXVNNI) ? ISA_AVXVNNI
           : cpu_runs(ISA_AVX2)    ? ISA_AVX2
                                   : ISA_NONE;
}

bool parse(const char * name, Isa & out) {
    if (name == nullptr || std::strcmp(name, "auto") == 0 || name[0] == '\0') {
        out = best_isa();
        return true;
    }
    for (int i = 0; i < N_ISAS; ++i) {
        if (std::strcmp(name, ISA_NAMES[i]) == 0) {
            out = (Isa) i;
            return cpu_runs(out);
        }
    }
    return false;
}

std::atomic<int> g_isa{ISA_UNSET};
std::atomic<bool> g_stock{false};   // "none" asked for by name: ggml's own paths everywhere

bool names_none(const char * name) {
    return name != nullptr && std::strcmp(name, "none") == 0;
}

Isa current_isa() {
    int isa = g_isa.load(std::memory_order_relaxed);
    if (isa == ISA_UNSET) {
        const char * requested = std::getenv("DFLASH_CPU_ISA");
        Isa chosen;
        if (!parse(requested, chosen)) {
            chosen = best_isa();   // an unknown or unsupported request: the best this CPU runs
        }
        int expected = ISA_UNSET;
        if (g_isa.compare_exchange_strong(expected, chosen)) {
            g_stock.store(names_none(requested));
        }
        isa = g_isa.load(std::memory_order_relaxed);
    }
    return (Isa) isa;
}

}  // namespace

extern "C" const char * dflash_cpu_isa(void) {
    return ISA_NAMES[current_isa()];
}

extern "C" bool dflash_cpu_set_isa(const char * isa) {
    Isa chosen;
    if (!parse(isa, chosen)) {
        return false;
    }
    current_isa();   // the environment's choice is settled first, so it cannot overwrite this one later
    g_isa.store(chosen);
    g_stock.store(names_none(isa));
    return true;
}

extern "C" bool dflash_cpu_batch_invariant(void) {
    current_isa();
    return !g_stock.load(std::memory_order_relaxed);
}

extern "C" bool dflash_cpu_float_weights(enum ggml_type type) {
    return type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 || type == GGML_TYPE_F32;
}

// Every width of a covered type goes to our kernels, one column too: ggml's own paths pick a
// different summation order per width (vec_dot for one column, tinyBLAS for more), which made verify
// rows differ from single-token decoding in the last bits. Measured against ggml's own path with
// tools/cpu_matmul_cost.py (all 210 SmolLM2-135M matrices, 2 threads): see README, The native layer.
extern "C" bool dflash_cpu_gemm_wanted(enum ggml_type type, int64_t n_cols) {
    if (n_cols < 1 || current_isa() == ISA_NONE) {
        return false;
    }
    if (dflash_cpu_float_weights(type)) {
        return true;
    }
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_IQ4_NL:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
        case GGML_TYPE_Q6_K:
        case GGML_TYPE_Q3_K:
        case GGML_TYPE_Q2_K:
        case GGML_TYPE_IQ4_XS:
        case GGML_TYPE_IQ3_XXS:
        case GGML_TYPE_IQ3_S:
        case GGML_TYPE_IQ2_XXS:
        case GGML_TYPE_IQ2_XS:
        case GGML_TYPE_IQ2_S:
        case GGML_TYPE_IQ1_S:
        case GGML_TYPE_IQ1_M:
            return true;
        default:
            return false;
    }
}

// a build without the variants: the quantized products' arguments, unused
#define DFLASH_CPU_GEMM_ARGS_UNUSED                                                                              \
    (void) type; (void) n_rows; (void) n_cols; (void) n_blocks; (void) A; (void) a_row_bytes; (void) B;         \
    (void) b_row_bytes; (void) C; (void) ldc; (void) ith; (void) nth; (void) next_chunk; (void) pool

// `call` (a function and its arguments) in the namespace of the variant `isa`
#define DFLASH_CPU_BY_ISA(isa, call)                                                                             \
    ((isa) == ISA_AVX512 ? dflash_cpu::avx512::call                                                             \
     : (isa) == ISA_AVXVNNI ? dflash_cpu::avxvnni::call                                                         \
                            : dflash_cpu::avx2::call)

// one quantized type's kernel of the variant `isa` (dflash_cpu_gemm, dflash_cpu_gemm_interleaved)
#define DFLASH_CPU_GEMM_CASE(TYPE, fn)                                                                           \
    case TYPE:                                                                                                  \
        return DFLASH_CPU_BY_ISA(isa, fn(n_rows, n_cols, n_blocks, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth, \
                                         next_chunk, pool));

extern "C" bool dflash_cpu_gemm(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t n_blocks,
                                const void * A, size_t a_row_bytes, const void * B, size_t b_row_bytes,
                                float * C, int64_t ldc, int ith, int nth, dflash_cpu_next_chunk next_chunk,
                                void * pool) {
    const Isa isa = current_isa();
    if (isa == ISA_NONE) {
        return false;
    }
#if DFLASH_CPU_VARIANTS
    switch (type) {
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q4_0, gemm_q4_0)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q4_1, gemm_q4_1)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q5_0, gemm_q5_0)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q5_1, gemm_q5_1)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q8_0, gemm_q8_0)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ4_NL, gemm_iq4_nl)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q4_K, gemm_q4_k)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q5_K, gemm_q5_k)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q6_K, gemm_q6_k)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q3_K, gemm_q3_k)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q2_K, gemm_q2_k)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ4_XS, gemm_iq4_xs)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ3_XXS, gemm_iq3_xxs)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ3_S, gemm_iq3_s)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ2_XXS, gemm_iq2_xxs)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ2_XS, gemm_iq2_xs)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ2_S, gemm_iq2_s)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ1_S, gemm_iq1_s)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ1_M, gemm_iq1_m)
        default:
            return false;
    }
#else
    DFLASH_CPU_GEMM_ARGS_UNUSED;
    return false;
#endif
}

// AVX-512's masked byte adds take a mask as stored; AVX2 builds one lane's 0x10s from a mask in five instructions
// (broadcast, shuffle, and, compare, and) and from a bit plane in two (a 16-bit shift and an and): Zen 3, one thread,
// lab/gemm_time.cpp, Q5_0 16384 x 576, planes against masks, two runs: B = 1 0.80x, B = 2 0.84-0.88x, B = 8
// 0.91-0.92x the time (docs/cpu-kernels.md)
extern "C" bool dflash_cpu_q5_0_bit_planes(void) {
    static const bool planes = best_isa() != ISA_AVX512;
    return planes;
}

extern "C" bool dflash_cpu_interleave_wanted(enum ggml_type type, int64_t n_rows) {
    const int isa = current_isa();
    if (n_rows <= 0 || n_rows % 8 != 0 || isa == ISA_NONE) {
        return false;
    }
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_IQ4_NL:
        case GGML_TYPE_Q2_K:
        case GGML_TYPE_Q3_K:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
        case GGML_TYPE_IQ3_XXS:
        case GGML_TYPE_IQ3_S:
        case GGML_TYPE_IQ2_XXS:
        case GGML_TYPE_IQ2_XS:
        case GGML_TYPE_IQ2_S:
        case GGML_TYPE_IQ1_S:
        case GGML_TYPE_IQ1_M:
        case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

namespace {

// Q5_0's fifth bits of an interleaved tile's block, as the masks of the lanes its unpacked quants take
// (q4_0_gemm.cpp): mask k holds, at bit 4 r + i, bit 4 k + i of row r's qh (the fifth bit of the value in byte i of
// row r's lane of q[k])
void q5_0_lane_masks(const char * const (&qh)[8], char * out) {
    for (int k = 0; k < 8; ++k) {
        uint32_t mask = 0;
        for (int r = 0; r < 8; ++r) {
            uint32_t bits;
            memcpy(&bits, qh[r], sizeof bits);
            mask |= ((bits >> (4 * k)) & 0xF) << (4 * r);
        }
        memcpy(out + 4 * k, &mask, sizeof mask);
    }
}

// ... or as bit planes (Q5_1's always): bit k of byte 4 r + i is bit 4 k + i of row r's qh (the fifth bit of the same
// value)
void fifth_bit_planes(const char * const (&qh)[8], char * out) {
    for (int r = 0; r < 8; ++r) {
        uint32_t bits;
        memcpy(&bits, qh[r], sizeof bits);
        for (int i = 0; i < 4; ++i) {
            unsigned plane = 0;
            for (int k = 0; k < 8; ++k) {
                plane |= ((bits >> (4 * k + i)) & 1u) << k;
            }
            out[4 * r + i] = (char) plane;
        }
    }
}

}  // namespace

extern "C" void dflash_cpu_interleave(enum ggml_type type, int64_t n_rows, size_t row_bytes, const void * src,
                                      void * dst) {
    const size_t block = ggml_type_size(type);
    // the layout: gemm.h; the bytes of a block's fp16 scale where the rest is whole words: leading (Q4_0, the lattice
    // IQ types) or trailing (Q6_K and Q3_K, whose d closes the block)
    const size_t odd = block % 4 == 2 ? 2 : 0;
    const size_t lead = type == GGML_TYPE_Q6_K || type == GGML_TYPE_Q3_K ? 0 : odd, trail = odd - lead;
    GGML_ASSERT(n_rows % 8 == 0 && (block - odd) % 4 == 0 && row_bytes % block == 0);
    const size_t words = (block - odd) / 4;
    // Q8_0's signed quants stored as q + 128, the unsigned bytes VNNI's dot steps take (q8_0_gemm.cpp)
    const unsigned char flip = type == GGML_TYPE_Q8_0 ? 0x80 : 0x00;
    const int64_t n_blocks = (int64_t) (row_bytes / block);
    for (int64_t r0 = 0; r0 < n_rows; r0 += 8) {
        const char * rows = (const char *) src + r0 * row_bytes;
        char * tile = (char *) dst + r0 * row_bytes;
        for (int64_t b = 0; b < n_blocks; ++b) {
            char * out = tile + b * 8 * block;
            const char * in_rows[8];
            for (int r = 0; r < 8; ++r) {
                const char * in = in_rows[r] = rows + r * row_bytes + b * block;
                memcpy(out + lead * r, in, lead);
                for (size_t w = 0; w < words; ++w) {
                    for (size_t i = 0; i < 4; ++i) {
                        out[8 * lead + 32 * w + 4 * r + i] = (char) (in[lead + 4 * w + i] ^ flip);
                    }
                }
                memcpy(out + 32 * words + trail * r, in + 4 * words, trail);
            }
            if (type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1) {   // the 8 rows' qh as their unpacking takes them
                const size_t at = type == GGML_TYPE_Q5_0 ? lead : 4;       // Q5_0's word 0, Q5_1's word 1
                const char * qh[8];
                for (int r = 0; r < 8; ++r) {
                    qh[r] = in_rows[r] + at;
                }
                if (type == GGML_TYPE_Q5_1 || dflash_cpu_q5_0_bit_planes()) {
                    fifth_bit_planes(qh, out + 8 * lead + 32 * (at / 4));
                } else {
                    q5_0_lane_masks(qh, out + 8 * lead);
                }
            }
        }
    }
}

extern "C" bool dflash_cpu_gemm_interleaved(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t n_blocks,
                                            const void * A, size_t a_row_bytes, const void * B, size_t b_row_bytes,
                                            float * C, int64_t ldc, int ith, int nth,
                                            dflash_cpu_next_chunk next_chunk, void * pool) {
#if DFLASH_CPU_VARIANTS
    const Isa isa = current_isa() != ISA_NONE ? current_isa() : best_isa();
    if (isa == ISA_NONE) {
        return false;
    }
    switch (type) {
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q4_K, gemm_q4_k_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q5_K, gemm_q5_k_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q6_K, gemm_q6_k_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q3_K, gemm_q3_k_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q2_K, gemm_q2_k_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q4_0, gemm_q4_0_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q4_1, gemm_q4_1_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q5_0, gemm_q5_0_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q5_1, gemm_q5_1_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_Q8_0, gemm_q8_0_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ4_NL, gemm_iq4_nl_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ3_XXS, gemm_iq3_xxs_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ3_S, gemm_iq3_s_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ2_XXS, gemm_iq2_xxs_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ2_XS, gemm_iq2_xs_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ2_S, gemm_iq2_s_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ1_S, gemm_iq1_s_interleaved)
        DFLASH_CPU_GEMM_CASE(GGML_TYPE_IQ1_M, gemm_iq1_m_interleaved)
        default:
            return false;
    }
#else
    DFLASH_CPU_GEMM_ARGS_UNUSED;
    return false;
#endif
}

#undef DFLASH_CPU_GEMM_CASE
#undef DFLASH_CPU_GEMM_ARGS_UNUSED

namespace {

int wide_k_tiles_choice() {
    const char * requested = std::getenv("DFLASH_CPU_WIDE_K_TILES");
    if (requested != nullptr && (std::strcmp(requested, "0") == 0 || std::strcmp(requested, "1") == 0)) {
        return requested[0] - '0';
    }
#if DFLASH_CPU_VARIANTS
    return cpu_runs(ISA_AVX512) && dflash_cpu::avx512::full_rate_512() ? 1 : 0;
#else
    return 0;
#endif
}

std::atomic<int> g_wide_k_tiles{-1};

}  // namespace

extern "C" bool dflash_cpu_wide_k_tiles(void) {
    int on = g_wide_k_tiles.load(std::memory_order_relaxed);
    if (on < 0) {
        int expected = -1;
        g_wide_k_tiles.compare_exchange_strong(expected, wide_k_tiles_choice());
        on = g_wide_k_tiles.load(std::memory_order_relaxed);
    }
    return on == 1;
}

extern "C" void dflash_cpu_set_wide_k_tiles(int on) {
    g_wide_k_tiles.store(on < 0 ? wide_k_tiles_choice() : (on ? 1 : 0));
}

extern "C" bool dflash_cpu_quantize_row_q8_K(const float * x, void * y, int64_t k) {
    const Isa isa = current_isa();
    if (isa == ISA_NONE) {
        return false;
    }
#if DFLASH_CPU_VARIANTS
    return DFLASH_CPU_BY_ISA(isa, quantize_q8_k(x, y, k));
#else
    (void) x; (void) y; (void) k;
    return false;
#endif
}

extern "C" bool dflash_cpu_gemm_f32_act(enum ggml_type type, int64_t n_rows, int64_t n_cols, int64_t k,
                                        const void * A, size_t a_row_bytes, const float * B, size_t b_row_bytes,
                                        float * C, int64_t ldc, int ith, int nth) {
    const Isa isa = current_isa();
    if (isa == ISA_NONE) {
        return false;
    }
#if DFLASH_CPU_VARIANTS
    return DFLASH_CPU_BY_ISA(isa,
                             gemm_float(type, n_rows, n_cols, k, A, a_row_bytes, B, b_row_bytes, C, ldc, ith, nth));
#else
    (void) type; (void) n_rows; (void) n_cols; (void) k; (void) A; (void) a_row_bytes; (void) B;
    (void) b_row_bytes; (void) C; (void) ldc; (void) ith; (void) nth;
    return false;
#endif
}
