#!/usr/bin/env python3
"""t(B)/t(1) of a model's weight matrix multiplies on the CPU backend, ours vs ggml's stock path.

Builds every linear layer of a model shape (default: SmolLM2-135M, 30 layers x q,k,v,o,gate,up,down;
qwen3-0.6b for the K-quants, whose rows must be multiples of 256) with random weights of one ggml type, then times one graph of all of them for activations of B = 1..N
columns. Each repetition visits every (B, path) in a shuffled order, so the shared machine's drift hits
all alike. "stock" is ggml's path with our kernels (and ggml's tiled K-quant path) stepping aside
(cplan.use_ref); "ours" is the default dispatch. Prints one JSON object with medians, min..max and ratios.

    .venv/bin/python lab/cpu_matmul_cost.py --type q4_1 --max-batch 16 --reps 9
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (n_embd, q width, k/v width, n_ff, n_layer)
MODEL_SHAPES = {
    "smollm2": (576, 576, 192, 1536, 30),       # SmolLM2-135M
    "qwen3-0.6b": (1024, 2048, 1024, 3072, 28),  # K multiples of 256, as the K-quants need
}


# (n_vocab, n_embd) of an output head, timed on its own (SmolLM2's Q4_1 file keeps it in Q8_0)
HEAD_SHAPES = {"smollm2-head": (49152, 576)}


def layer_shapes(model: str) -> list[tuple[int, int]]:
    """[(n_rows, k)] of every linear layer (q, k, v, o, gate, up, down), in graph order."""
    if model in HEAD_SHAPES:
        return [HEAD_SHAPES[model]]
    e, q, kv, ff, n_layer = MODEL_SHAPES[model]
    return [(q, e), (kv, e), (kv, e), (e, q), (ff, e), (ff, e), (e, ff)] * n_layer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", default="q4_1")
    ap.add_argument("--model", default="smollm2", choices=sorted(MODEL_SHAPES) + sorted(HEAD_SHAPES))
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--batches", default=None, help="comma list instead of 1..max-batch")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default="stock,ours", help="which of stock,ours to time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ggml-dir", type=Path, default=None,
                    help="time the libggml-base/libggml-cpu of this build folder instead of the project's libraries")
    ap.add_argument("--isa", default=None, choices=["avx512", "avxvnni", "avx2"],
                    help="run our kernels' variant for this instruction set (default: the best the CPU runs)")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="with --threads 1: time this thread's CPU time (robust on a busy machine)")
    a = ap.parse_args(argv)

    from dflash_gguf.native.lib import load
    from lab.matmul_probe import MatmulProbe

    batches = [int(b) for b in a.batches.split(",")] if a.batches else list(range(1, a.max_batch + 1))
    paths = a.paths.split(",")
    shapes = layer_shapes(a.model)
    if a.ggml_dir:   # a ggml-only build (e.g. another -march): the probe needs just these two libraries
        import ctypes
        import types
        native = types.SimpleNamespace(lib_dir=a.ggml_dir, ggml_base=ctypes.CDLL(str(a.ggml_dir / "libggml-base.so")))
    else:
        native = load()
    probe = MatmulProbe(native, a.type, shapes, batches)
    if a.isa:
        from dflash_gguf.native.cpu_kernels import CpuKernels
        if not CpuKernels(native).set_isa(a.isa):
            ap.error(f"this CPU (or this build) cannot run the {a.isa} variant")
    rng = np.random.default_rng(a.seed)
    quantized: dict[tuple[int, int], np.ndarray] = {}
    for i, shape in enumerate(shapes):   # one random matrix per shape, copied into every layer
        if shape not in quantized:
            quantized[shape] = probe.quantize(rng.standard_normal(shape, dtype=np.float32) * 0.05)
        probe.set_weights(i, quantized[shape])
    for n in batches:
        for k in sorted({k for _, k in shapes}):
            probe.set_activations(rng.standard_normal((n, k), dtype=np.float32))

    jobs = [(n, p) for n in batches for p in paths]
    for n, p in jobs:                    # warm-up
        probe.compute(n, a.threads, use_ref=(p == "stock"))
    times: dict[tuple[int, str], list[float]] = {j: [] for j in jobs}
    order_rng = random.Random(a.seed)
    for _ in range(a.reps):
        order_rng.shuffle(jobs)
        for n, p in jobs:
            times[n, p].append(probe.time_compute(n, a.threads, use_ref=(p == "stock"),
                                                      cpu_clock=a.cpu_clock))

    out: dict = {"type": a.type, "model": a.model, "threads": a.threads, "reps": a.reps,
                 "clock": "thread_cpu" if a.cpu_clock else "wall",
                 "lib_dir": str(native.lib_dir), "isa": a.isa or "best", "paths": {}}
    for p in paths:
        t1 = statistics.median(times[batches[0], p])
        out["paths"][p] = {n: {"median_ms": round(statistics.median(times[n, p]) * 1e3, 3),
                               "min_ms": round(min(times[n, p]) * 1e3, 3),
                               "max_ms": round(max(times[n, p]) * 1e3, 3),
                               "ratio": round(statistics.median(times[n, p]) / t1, 3)} for n in batches}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
