#!/usr/bin/env python3
"""Why a verify of 2 rows measured 3.7 decodes of 1 on SmolLM2 on an H200 (2026-12-04) while the bench's decode loop
paid 1.16: t(B) of one target decode after 256 tokens, (a) in the calibration's order (every call a new width),
(b) steady (the same width back to back, the later calls counted), (c) in the calibration's order again.
Random weights of SmolLM2-135M's geometry (and the ~2B one with --shape) written on the machine.
--graph-key node times ggml-cuda's CUDA graphs keyed by the first node alone (upstream's key, before
patches/0021 gave each graph shape its own), into shape-probe-node.json beside shape-probe.json.

    python3 tools/gpu/shape_probe.py --out DIR [--shape smollm2-135m] [--ftype q4_1] [-ngl 99] [--graph-key node]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_gguf import SHAPES, make  # noqa: E402

WIDTHS = (1, 2, 3, 4, 8, 16)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--ftype", default="q4_1")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=99)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--graph-key", choices=("shape", "node"), default="shape",
                    help="CUDA graph cache key: per graph shape (ours) or the first node only (upstream's)")
    a = ap.parse_args()
    if a.graph_key == "node":      # read once, when ggml-cuda first keys a graph: set before the library loads
        os.environ["DFLASH_CUDA_GRAPH_KEY"] = "node"
    from dflash_gguf.engine.target import Target
    from dflash_gguf.native.wrappers import ContextSettings, Model

    a.out.mkdir(parents=True, exist_ok=True)
    desc = make(a.shape, a.ftype, a.out / f"{a.shape}-{a.ftype}.gguf")
    model = Model(Path(desc["path"]), n_gpu_layers=a.n_gpu_layers)
    n_layer = model.n_layer
    target = Target(model, ContextSettings(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=a.threads),
                    taps=[1, n_layer // 2, n_layer - 1], max_verify=max(WIDTHS))
    context = [(17 + 7919 * i) % model.n_vocab for i in range(256)]
    target.prefill(context, None)
    probe = context[-1]

    def t(b: int) -> float:
        return 1e3 * target.time_verify([probe] * b)

    def interleaved() -> dict[int, float]:
        times = {b: [] for b in WIDTHS}
        for _ in range(a.rounds):
            for b in WIDTHS:
                times[b].append(t(b))
        return {b: statistics.median(v) for b, v in times.items()}

    def steady() -> dict[int, float]:
        out = {}
        for b in WIDTHS:
            runs = [t(b) for _ in range(4 + 2 * a.rounds)]
            out[b] = statistics.median(runs[4:])
        return out

    t0 = time.perf_counter()
    result = {"model": desc, "graph_key": a.graph_key, "widths": WIDTHS, "interleaved": interleaved(),
              "steady": steady(), "interleaved_again": interleaved()}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    for name in ("interleaved", "steady", "interleaved_again"):
        ms = result[name]
        print(f"{name:18s} t(1) {ms[1]:.3f} ms  t(B)/t(1): "
              + " ".join(f"B{b}={ms[b] / ms[1]:.2f}" for b in WIDTHS[1:]), flush=True)
    name = "shape-probe.json" if a.graph_key == "shape" else f"shape-probe-{a.graph_key}.json"
    (a.out / name).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
