#!/usr/bin/env python3
"""t(B)/t(1): what verifying B tokens costs relative to one decode step, through our native layer.

After a fixed context (default 256 tokens) it times a verify batch of B tokens the way the engine's own
calibration does (engine/target.Target.time_verify: B rows with logits, rolled back); every B is timed
`--reps` times in an interleaved order (the machine is shared, so drift hits every B alike). Prints one JSON object: per B the median time, the spread
(min..max) and the ratio of medians to B=1.

    .venv/bin/python tools/verify_cost.py --model smollm2:q4_1 --max-batch 16 --reps 7
    DFLASH_GGUF_LIB_DIR=/path/to/other/libs .venv/bin/python tools/verify_cost.py ...   # another build
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROSE = ("The history of the printing press begins long before Gutenberg. Craftsmen in many lands "
         "carved wooden blocks, inked them and pressed paper against the raised letters. ")


def resolve_model(spec: str) -> Path:
    """'smollm2:<precision>' (the embedded target, requantized and cached) or a GGUF path."""
    if spec.startswith("smollm2"):
        from dflash_gguf.targets import smollm2
        return smollm2(spec.partition(":")[2] or "q4_1")
    return Path(spec)


def measure(model_path: Path, batches: list[int], reps: int, n_ctx_tokens: int, threads: int,
            seed: int, cpu_clock: bool = False, flash_attn: str = "auto", n_gpu_layers: int = 0) -> dict:
    from dflash_gguf.engine.target import Target
    from dflash_gguf.native.lib import load
    from dflash_gguf.native.wrappers import ContextSettings, Model

    native = load()
    model = Model(model_path, n_gpu_layers=n_gpu_layers)
    target = Target(model, ContextSettings(n_ctx=n_ctx_tokens + max(batches) + 16, n_batch=512, n_ubatch=512,
                                           n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn),
                    max_verify=max(batches))
    target.prefill(model.tokenize(PROSE * 64, add_special=False)[:n_ctx_tokens], None)
    draft = model.tokenize(PROSE, add_special=False)

    # with one thread ggml computes in this thread, so its CPU time ignores time spent descheduled
    clock = time.thread_time if cpu_clock else time.perf_counter

    def one(b: int) -> float:
        return target.time_verify(draft[:b], clock)

    for b in batches:                    # warm-up: graphs, buffers, page cache
        one(b)
    times: dict[int, list[float]] = {b: [] for b in batches}
    rng = random.Random(seed)
    for _ in range(reps):
        order = list(batches)
        rng.shuffle(order)
        for b in order:
            times[b].append(one(b))
    t1 = statistics.median(times[batches[0]])
    rows = {b: {"median_ms": round(statistics.median(ts) * 1e3, 3),
                "min_ms": round(min(ts) * 1e3, 3), "max_ms": round(max(ts) * 1e3, 3),
                "ratio": round(statistics.median(ts) / t1, 3)} for b, ts in times.items()}
    return {"model": str(model_path), "lib_dir": str(native.lib_dir), "threads": threads,
            "clock": "thread_cpu" if cpu_clock else "wall", "flash_attn": flash_attn, "n_gpu_layers": n_gpu_layers,
            "context": n_ctx_tokens, "reps": reps, "batches": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2:q4_1", help="GGUF path or smollm2:<precision>")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flash-attn", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="target layers on the GPU (99: all)")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="with --threads 1: time this thread's CPU time (robust on a busy machine)")
    a = ap.parse_args(argv)
    if a.cpu_clock and a.threads != 1:
        ap.error("--cpu-clock measures the calling thread: use it with --threads 1")
    out = measure(resolve_model(a.model), list(range(1, a.max_batch + 1)), a.reps, a.context, a.threads, a.seed,
                  a.cpu_clock, a.flash_attn, a.n_gpu_layers)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
