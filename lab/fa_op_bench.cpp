// Times ggml-cpu's flash attention op alone, as a decode or a verify runs it: `layers` ops, each on a K/V cache of
// `n_kv` positions laid out as llama.cpp's (one row of all K/V heads per position; CONTIG=1: each head contiguous),
// with 256 MB streamed between passes as a decode's weights would evict the caches (NOEVICT=1: not), on 2 threads.
// Prints the minimum and median of `iters` passes. Used in docs/cpu-kernels.md ("Adjacent K/V heads in one unit").
//
//   g++ -O2 -std=c++17 lab/fa_op_bench.cpp -I <src-cpu>/ggml/include -L <lib dir> -lggml-base -lggml-cpu -o fa_op_bench
//   LD_LIBRARY_PATH=<lib dir> ./fa_op_bench 128 16 8 2000 1 20     # head size, query heads, K/V heads, positions, B, iters
//
// <lib dir>: the folder `dflash-gguf build --backend cpu` prints; <src-cpu>: the patched tree it was built from
// (src-cpu beside lib/ in the same native folder of the user cache).
#include "ggml.h"
#include "ggml-cpu.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstring>
#include <cmath>
#include <algorithm>
int main(int argc, char ** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s HEAD_SIZE Q_HEADS KV_HEADS POSITIONS B ITERS [LAYERS]\n", argv[0]);
        return 2;
    }
    int D = atoi(argv[1]), NH = atoi(argv[2]), HKV = atoi(argv[3]), NKV = atoi(argv[4]), B = atoi(argv[5]), iters = atoi(argv[6]);
    int layers = argc > 7 ? atoi(argv[7]) : 28;
    size_t mem = (size_t) layers * (2ull * D * HKV * NKV * 2 + (size_t) D * B * NH * 8 + 4ull * NKV * 64) + (16ull << 20);
    ggml_init_params ip = {mem, nullptr, false};
    ggml_context * ctx = ggml_init(ip);
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 4096, false);
    const bool contig = getenv("CONTIG") != nullptr;
    const bool evict_between = getenv("NOEVICT") == nullptr;
    srand(1);
    for (int l = 0; l < layers; ++l) {
        ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, B, NH);
        // K/V as llama's cache: [D, HKV, NKV] viewed as [D, NKV, HKV] with nb1 = row of all heads
        ggml_tensor * kc = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, D, HKV, NKV);
        ggml_tensor * vc = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, D, HKV, NKV);
        ggml_tensor * k = contig ? ggml_reshape_3d(ctx, kc, D, NKV, HKV) : ggml_view_3d(ctx, kc, D, NKV, HKV, kc->nb[2], kc->nb[1], 0);
        ggml_tensor * v = contig ? ggml_reshape_3d(ctx, vc, D, NKV, HKV) : ggml_view_3d(ctx, vc, D, NKV, HKV, vc->nb[2], vc->nb[1], 0);
        int Bp = (B + 63) / 64 * 64;
        ggml_tensor * m = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, NKV, Bp);
        float * qd = (float *) q->data; for (int64_t i = 0; i < ggml_nelements(q); ++i) qd[i] = (rand() % 2000 - 1000) / 1000.0f;
        ggml_fp16_t * kd = (ggml_fp16_t *) kc->data; for (int64_t i = 0; i < ggml_nelements(kc); ++i) kd[i] = ggml_fp32_to_fp16((rand() % 2000 - 1000) / 1000.0f);
        ggml_fp16_t * vd = (ggml_fp16_t *) vc->data; for (int64_t i = 0; i < ggml_nelements(vc); ++i) vd[i] = ggml_fp32_to_fp16((rand() % 2000 - 1000) / 1000.0f);
        ggml_fp16_t * md = (ggml_fp16_t *) m->data; for (int r = 0; r < Bp; ++r) for (int j = 0; j < NKV; ++j) md[r * NKV + j] = ggml_fp32_to_fp16(j <= NKV - B + r ? 0.0f : -INFINITY);
        ggml_tensor * o = ggml_flash_attn_ext(ctx, q, k, v, m, 1.0f / 8, 0.0f, 0.0f);
        ggml_build_forward_expand(gf, o);
    }
    // a buffer streamed between passes, as the weights evict the cache in a decode
    std::vector<char> evict(256u << 20, 1);
    std::vector<double> ts;
    volatile long sink = 0;
    // one plan and work buffer for every pass (ggml_graph_compute_with_ctx takes a new one from ctx each call)
    ggml_cplan plan = ggml_graph_plan(gf, 2, nullptr);
    std::vector<uint8_t> work(plan.work_size);
    plan.work_data = work.data();
    for (int it = 0; it < iters; ++it) {
        if (evict_between) for (size_t i = 0; i < evict.size(); i += 64) sink += evict[i];
        auto t0 = std::chrono::steady_clock::now();
        ggml_graph_compute(gf, &plan);
        ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    printf("D=%d NH=%d HKV=%d NKV=%d B=%d layers=%d: min %.3f med %.3f ms\n", D, NH, HKV, NKV, B, layers, ts[0], ts[ts.size() / 2]);
    return 0;
}
