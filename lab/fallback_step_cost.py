#!/usr/bin/env python3
"""Paired per-step cost of a fallback step over a plain step, on one target context.

Alternates, in random order, one fallback step of the speculative loop (policy.choose() + its plain step, the
row handed to the drafter) and one step of the plain decoder at the same position (removed again afterwards),
`--steps` pairs per generation, 3 generations after the prefill of a short code prompt. Thread CPU time with
one thread (ggml computes in the calling thread), so time other processes take from the core does not count.
Prints the medians and the paired difference (mean with its standard error, and median), in µs and in % of a
plain step. The mean includes the batched injection of the kept rows (every 64 steps); the median does not.

    .venv/bin/python lab/fallback_step_cost.py --steps 500
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    import numpy as np

    from dflash_gguf.engine.loop import GenerationResult, SpecDecoder
    from dflash_gguf.engine.cost import CostCurve
    from dflash_gguf.engine.policy import DraftLengthPolicy
    from dflash_gguf.engine.sampling import SamplingParams
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.settings import EngineSettings

    e = Engine(EngineSettings(n_threads=1))
    never = DraftLengthPolicy(e.draft_max, cost=CostCurve.from_json(e.cost.to_json()), margin=float("inf"),
                              probe_every=1 << 30)
    spec = SpecDecoder(e.target, e.drafter, never)
    plain = SpecDecoder(e.target, None, DraftLengthPolicy(1, adaptive=False))
    has_plain_step = hasattr(spec, "_plain_step")      # older trees step through _step with n = 0

    def fallback_step(last, res):
        n = never.choose()
        return spec._plain_step(last, sp, rng, res) if has_plain_step else spec._step(last, n, sp, rng, res)

    def plain_step(last, res):
        return plain._plain_step(last, sp, rng, res) if has_plain_step else plain._step(last, 0, sp, rng, res)

    clock, sp, rng, order = time.thread_time, SamplingParams(), np.random.default_rng(0), random.Random(a.seed)
    prompt = e.tokenize('def fib(n):\n    """Return the nth Fibonacci number."""\n', add_special=True)
    fallback_t, plain_t = [], []
    for _ in range(3):
        e.target.reset()
        e.drafter.begin()
        never.reset()
        res = GenerationResult([], len(prompt))
        last = int(np.argmax(e.target.prefill(prompt, e.drafter.process)))
        for _ in range(a.steps):
            for which in (("f", "p") if order.random() < 0.5 else ("p", "f")):
                t0 = clock()
                if which == "f":
                    out = fallback_step(last, res)
                    fallback_t.append(clock() - t0)
                else:
                    plain_step(last, res)
                    plain_t.append(clock() - t0)
                    e.target.ctx.seq_rm(e.target.n_past - 1, -1)     # the plain row leaves no trace
                    e.target.n_past -= 1
            last = out[-1]
    d = np.array(fallback_t) - np.array(plain_t)
    t1 = statistics.median(plain_t)
    print(f"plain step median {1e3 * t1:.3f} ms, fallback step median {1e3 * statistics.median(fallback_t):.3f} ms; "
          f"fallback - plain: mean {1e6 * d.mean():.1f} us (s.e. {1e6 * d.std() / np.sqrt(len(d)):.1f}) = "
          f"{100 * d.mean() / t1:.2f} %, median {1e6 * np.median(d):.1f} us = {100 * np.median(d) / t1:.2f} %; "
          f"{len(d)} pairs")
    e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
