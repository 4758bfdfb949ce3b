#!/usr/bin/env python3
"""t(B)/t(1) of stock llama.cpp beside ours: upstream's llama-bench, built from the same tree, times one batch of B
prompt tokens after --context tokens of depth (`-p B -n 0 -d CONTEXT`), logits for the last row only; our
`bench --cost-curve-only` times the engine's verify (B rows of logits and the layer taps) after as many tokens. The kernels are the same (no patch
touches ggml-cuda), so the gap between the two curves is what our verify adds on top of llama.cpp's batch.

Prints one JSON object: `batches: {B: {median_ms, min_ms, max_ms, ratio}}`.

    python tools/gpu/stock_curve.py --bench <lib dir>/tools/llama-bench --model m.gguf --max-batch 16 -ngl 99
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def curve(rows: list[dict]) -> dict:
    """llama-bench JSON rows -> {B: {median_ms, min_ms, max_ms, ratio}} with ratio = median t(B) / median t(1)."""
    out = {}
    for r in sorted(rows, key=lambda r: r["n_prompt"]):
        ms = [ns / 1e6 for ns in r["samples_ns"]]
        out[str(r["n_prompt"])] = {"median_ms": round(statistics.median(ms), 4), "min_ms": round(min(ms), 4),
                                   "max_ms": round(max(ms), 4)}
    t1 = out.get("1", {}).get("median_ms")
    for v in out.values():
        v["ratio"] = round(v["median_ms"] / t1, 3) if t1 else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", type=Path, required=True, help="the llama-bench executable")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--context", type=int, default=None, help="default: the context our cost curve decodes first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=99)
    a = ap.parse_args(argv)
    if a.context is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from dflash_gguf.engine.session import CALIBRATION_CONTEXT
        a.context = CALIBRATION_CONTEXT
    batches = ",".join(str(b) for b in range(1, a.max_batch + 1))
    cmd = [str(a.bench), "-m", str(a.model), "-p", batches, "-n", "0", "-d", str(a.context), "-r", str(a.reps),
           "-ngl", str(a.n_gpu_layers), "-t", str(a.threads), "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        print(f"stock_curve: llama-bench failed (exit {proc.returncode})", file=sys.stderr)
        return 1
    rows = json.loads(proc.stdout)
    device = sorted({r.get("gpu_info") or r.get("cpu_info") or "" for r in rows})
    print(json.dumps({"model": str(a.model), "tool": "llama-bench", "command": " ".join(cmd), "device": device,
                      "n_gpu_layers": a.n_gpu_layers, "context": a.context, "batches": curve(rows)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
