// Times our CPU matrix multiply alone (dflash_cpu_gemm_interleaved, or dflash_cpu_gemm for types kept row-major) on
// random weights of one ggml type, one thread, the widths in rounds inside one process (on a VM, separate processes
// place large weights differently and disagree with each other). Types kept interleaved are timed in ggml's row
// layout too, side by side in the same rounds. Activations are each type's own (ggml's vec_dot_type), quantized as
// ggml does. Prints per width and layout the median and minimum, and the multiply-adds a second.
// Used in docs/cpu-kernels.md ("The tile ahead into L2, not L1", "Q6_K interleaved").
//
//   g++ -O2 -std=c++17 lab/gemm_time.cpp -I <src-cpu>/ggml/include -I ggml-kernels/cpu -L <lib dir> -lggml-base -lggml-cpu -o gemm_time
//   LD_LIBRARY_PATH=<lib dir> ./gemm_time q4_K 65536 2048 20 1 2 4 8    # type, rows, K, rounds, widths...
//   GEMM_TIME_INTERLEAVE=1 LD_LIBRARY_PATH=<lib dir> ./gemm_time q6_K ...   # both layouts whatever this CPU keeps
//
// Rows x K larger than the L3 times weights streamed from memory, as a decode reads them; smaller, from the caches.
// <lib dir>: the folder `dflash-gguf build --backend cpu` prints; <src-cpu>: the patched tree it was built from.
#include "ggml.h"
#include "ggml-cpu.h"
#include "gemm.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s TYPE ROWS K ROUNDS WIDTH...\n", argv[0]);
        return 2;
    }
    ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * name = ggml_type_name((ggml_type) t);
        if (name != nullptr && strcmp(name, argv[1]) == 0) {
            type = (ggml_type) t;
        }
    }
    if (type == GGML_TYPE_COUNT) {
        fprintf(stderr, "unknown type %s (ggml's names: q4_0, q8_0, q4_K, q6_K, iq4_nl, ...)\n", argv[1]);
        return 2;
    }
    const int64_t rows = atoll(argv[2]), K = atoll(argv[3]);
    const int rounds = atoi(argv[4]);
    std::vector<int> widths;
    for (int i = 5; i < argc; ++i) {
        widths.push_back(atoi(argv[i]));
    }
    const int max_b = *std::max_element(widths.begin(), widths.end());
    ggml_cpu_init();
    const ggml_type act_type = ggml_get_type_traits_cpu(type)->vec_dot_type;
    const ggml_from_float_t quantize_act = ggml_get_type_traits_cpu(act_type)->from_float;
    const size_t row_bytes = ggml_row_size(type, K), act_bytes = ggml_row_size(act_type, K);
    const int64_t n_blocks = K / ggml_blck_size(act_type);

    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> w((size_t) (rows * K)), x((size_t) K);
    for (float & v : w) {
        v = normal(rng);
    }
    std::vector<char> q((size_t) rows * row_bytes), weights((size_t) rows * row_bytes);
    // the types ggml will not quantize without an importance matrix get a flat one
    const std::vector<float> imatrix(K, 1.0f);
    ggml_quantize_chunk(type, w.data(), q.data(), 0, rows, K, ggml_quantize_requires_imatrix(type) ? imatrix.data() : nullptr);
    // GEMM_TIME_INTERLEAVE=1: time the interleaved layout too where this CPU keeps the type in ggml's (an A/B of
    // dflash_cpu_interleave_wanted's choice, as for Q6_K on AVX2 in docs/cpu-kernels.md)
    const char * force = getenv("GEMM_TIME_INTERLEAVE");
    const bool interleaved = (force != nullptr && strcmp(force, "1") == 0) || dflash_cpu_interleave_wanted(type, rows);
    if (interleaved) {
        dflash_cpu_interleave(type, rows, row_bytes, q.data(), weights.data());
    }
    std::vector<char> act((size_t) max_b * act_bytes);
    for (int j = 0; j < max_b; ++j) {
        for (float & v : x) {
            v = normal(rng) * 50.0f;
        }
        quantize_act(x.data(), act.data() + j * act_bytes, K);
    }
    std::vector<float> out((size_t) (max_b * rows));
    printf("%s (%s), %lld x %lld, %.1f MB, activations %s, ISA %s\n", argv[1],
           interleaved ? "interleaved and row-major layouts" : "row-major layout", (long long) rows, (long long) K,
           rows * row_bytes / 1e6, ggml_type_name(act_type), dflash_cpu_isa());

    struct Arm {
        int width;
        bool interleaved;
        std::vector<double> times;
    };
    std::vector<Arm> arms;
    for (int width : widths) {
        if (interleaved) {
            arms.push_back({width, true, {}});
        }
        arms.push_back({width, false, {}});
    }
    for (int r = 0; r < rounds + 1; ++r) {
        for (size_t i = 0; i < arms.size(); ++i) {
            Arm & arm = arms[r % 2 ? arms.size() - 1 - i : i];   // the order alternates between rounds
            const auto t0 = std::chrono::steady_clock::now();
            const bool ok = arm.interleaved
                ? dflash_cpu_gemm_interleaved(type, rows, arm.width, n_blocks, weights.data(), row_bytes, act.data(),
                                              act_bytes, out.data(), rows, 0, 1, nullptr, nullptr)
                : dflash_cpu_gemm(type, rows, arm.width, n_blocks, q.data(), row_bytes, act.data(), act_bytes,
                                  out.data(), rows, 0, 1, nullptr, nullptr);
            if (!ok) {
                fprintf(stderr, "%s at width %d is not one of our kernels' (ggml's own path runs it)\n", argv[1],
                        arm.width);
                return 1;
            }
            if (r > 0) {   // the first round warms up
                arm.times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
        }
    }
    for (Arm & arm : arms) {
        std::sort(arm.times.begin(), arm.times.end());
        const double median = arm.times[arm.times.size() / 2];
        printf("B=%-3d %-11s median %.3f ms  min %.3f ms  %.1f G multiply-adds/s\n", arm.width,
               arm.interleaved ? "interleaved" : "row-major", median * 1e3, arm.times[0] * 1e3,
               (double) rows * K * arm.width / median / 1e9);
    }
    return 0;
}
