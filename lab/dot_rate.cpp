// How many integer dot steps a core issues per cycle, the instructions our CPU kernels are built from: VNNI's
// vpdpbusd at 256 and 512 bits (register operands, a separate broadcast from memory, the broadcast folded into
// the instruction), vpmulld (the K-quants' group scales) and AVX2's step (vpmaddubsw + vpaddw). Twelve independent
// accumulators per loop, so the count is throughput, not latency; cycles from a chain of dependent adds timed
// alongside (one add a cycle), so turbo clocks are counted right. Used in docs/cpu-kernels.md ("The floor").
//
//   g++ -O2 -march=native lab/dot_rate.cpp -o dot_rate && ./dot_rate     (VNNI rows need AVX-512 VNNI)
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__attribute__((noinline)) void add_chain(uint64_t n) {
    uint64_t x = 0;
    for (uint64_t i = 0; i < n; ++i) {
        asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    }
}

#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
// one timed loop: `setup` loads the operands once, STEP(k) is one step on accumulator k (twelve per iteration)
#define RATE_LOOP(name, setup, STEP)                                      \
    __attribute__((noinline)) void name(uint64_t n, const int * p) {     \
        asm volatile(setup ::"r"(p) : "xmm15", "xmm14");                  \
        for (uint64_t i = 0; i < n; ++i) {                                \
            REP12(STEP)                                                   \
        }                                                                 \
    }

#define ONE_OPERAND "vpbroadcastd (%0), %%ymm15\n\tvmovdqu (%0), %%ymm14"
#define MADDUBS_ADD(k) asm volatile("vpmaddubsw %%ymm14, %%ymm15, %%ymm13\n\tvpaddw %%ymm13, %%ymm" #k ", %%ymm" #k ::: "xmm" #k, "xmm13");
RATE_LOOP(maddubs_add, ONE_OPERAND, MADDUBS_ADD)        // AVX2: one step = 2 instructions

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DP_REG(k) asm volatile("vpdpbusd %%ymm14, %%ymm15, %%ymm" #k ::: "xmm" #k);
#define DP_BROADCAST(k) asm volatile("vpbroadcastd %c0(%1), %%ymm13\n\tvpdpbusd %%ymm13, %%ymm14, %%ymm" #k ::"i"(4 * k), "r"(p) : "xmm" #k, "xmm13");
#define DP_FOLDED(k) asm volatile("vpdpbusd %c0(%1)%{1to8%}, %%ymm14, %%ymm" #k ::"i"(4 * k), "r"(p) : "xmm" #k);
#define DP_512(k) asm volatile("vpdpbusd %c0(%1)%{1to16%}, %%zmm14, %%zmm" #k ::"i"(4 * k), "r"(p) : "xmm" #k);
#define MULLD(k) asm volatile("vpmulld %c0(%1)%{1to8%}, %%ymm14, %%ymm" #k ::"i"(4 * k), "r"(p) : "xmm" #k);
RATE_LOOP(dp_reg, ONE_OPERAND, DP_REG)
RATE_LOOP(dp_broadcast, "vmovdqu (%0), %%ymm14", DP_BROADCAST)
RATE_LOOP(dp_folded, "vmovdqu (%0), %%ymm14", DP_FOLDED)
RATE_LOOP(dp_512, "vmovdqu64 (%0), %%zmm14", DP_512)
RATE_LOOP(mulld, "vmovdqu (%0), %%ymm14", MULLD)
#endif

int main() {
    const uint64_t n = 20000000;
    alignas(64) int p[64];
    for (int i = 0; i < 64; ++i) {
        p[i] = i * 12345;
    }
    for (int round = 0; round < 3; ++round) {
        double t0 = now();
        add_chain(n);
        const double ghz = 4.0 * n / (now() - t0) / 1e9;
        auto per_cycle = [&](void (*f)(uint64_t, const int *)) {
            const double a = now();
            f(n, p);
            return 12.0 * n / ((now() - a) * ghz * 1e9);
        };
        printf("clock %.2f GHz: AVX2 maddubs+add steps %.2f/cycle", ghz, per_cycle(maddubs_add));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        printf("; vpdpbusd ymm %.2f (registers) %.2f (+ broadcast) %.2f (folded broadcast), zmm %.2f; vpmulld ymm %.2f",
               per_cycle(dp_reg), per_cycle(dp_broadcast), per_cycle(dp_folded), per_cycle(dp_512), per_cycle(mulld));
#endif
        printf(" per cycle\n");
    }
}
