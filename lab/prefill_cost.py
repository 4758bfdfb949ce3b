#!/usr/bin/env python3
"""Prompt processing time of a GGUF target on the CPU: our kernels against ggml's stock paths, side by side.

Each repetition runs one child process per path (`DFLASH_CPU_ISA=auto` ours, `none` stock: the variant is chosen
when the weights load, and stock repacks some types then), alternating, so the shared machine's drift hits both.
A child loads the model, prefills N tokens of made-up text in one ubatch (`-b`), clears the cache, and times
`--inner` such prefills. Prints one JSON object with each path's median seconds and the ratio ours / stock.

    .venv/bin/python lab/prefill_cost.py -m gemma-3-270m-it-Q4_K_M.gguf --tokens 512 -t 2 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PATHS = {"ours": "auto", "stock": "none"}


def child(model: str, tokens: int, threads: int, batch: int, inner: int) -> list[float]:
    from dflash_gguf.native.lib import load
    from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, Model

    native = load()
    m = Model(model)
    text = " ".join(f"word{i % 97} item{i % 13}" for i in range(tokens))
    ids = m.tokenize(text)[:tokens]
    ctx = Context(m, ContextSettings(n_ctx=tokens + 64, n_batch=batch, n_ubatch=batch, n_threads=threads))
    b = Batch(native, batch)
    out = []
    for _ in range(inner + 1):                       # the first one warms up
        ctx.clear()
        t0 = time.perf_counter()
        for i in range(0, len(ids), batch):
            chunk = ids[i:i + batch]
            b.set_tokens(chunk, i, "last" if i + batch >= len(ids) else "none")
            ctx.decode(b, "prefill")
        out.append(time.perf_counter() - t0)
    b.close()
    ctx.close()
    m.close()
    return out[1:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-b", "--batch", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--inner", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.model, a.tokens, a.threads, a.batch, a.inner)))
        return 0
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    for _ in range(a.reps):
        for name, isa in PATHS.items():
            cmd = [sys.executable, __file__, "--child", "-m", a.model, "--tokens", str(a.tokens), "-t", str(a.threads),
                   "-b", str(a.batch), "--inner", str(a.inner)]
            res = subprocess.run(cmd, env=os.environ | {"DFLASH_CPU_ISA": isa}, capture_output=True, text=True)
            if res.returncode != 0:
                sys.exit(f"{name}: {res.stderr.strip()[-2000:]}")
            times[name] += json.loads(res.stdout.strip().splitlines()[-1])
    med = {p: statistics.median(v) for p, v in times.items()}
    print(json.dumps({"model": Path(a.model).name, "tokens": a.tokens, "threads": a.threads,
                      "median_s": {p: round(v, 3) for p, v in med.items()},
                      "range_s": {p: [round(min(v), 3), round(max(v), 3)] for p, v in times.items()},
                      "ours_over_stock": round(med["ours"] / med["stock"], 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
