#!/usr/bin/env python3
"""Harvest throughput (target-written tokens per second) at several numbers of parallel sequences.

Each setting generates for --seconds into a scratch folder (same prompts, features and top-k kept as in a
real harvest); the folders are removed afterwards. Use the best setting for `dflash-gguf train --parallel`.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dflash_gguf.targets import smollm2_q4_1  # noqa: E402
from dflash_gguf.train.harvest import HarvestSettings, harvest  # noqa: E402
from dflash_gguf.train.prompts import load  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("-m", "--model", type=Path, default=None, help="target GGUF (default: embedded SmolLM2)")
ap.add_argument("--prompts", type=Path, default=Path(__file__).resolve().parent.parent / "dflash_gguf/train/data/prompts.jsonl")
ap.add_argument("--parallel", type=int, nargs="+", default=[8, 16, 32, 64])
ap.add_argument("--seconds", type=float, default=60.0)
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--no-features", action="store_true", help="keep tokens and top-k only")
a = ap.parse_args()

target = a.model or smollm2_q4_1()
rows = load(a.prompts)
report = []
for n in a.parallel:
    tmp = Path(tempfile.mkdtemp(prefix="harvest-tp-"))
    try:
        s = HarvestSettings(taps=[2, 11, 19, 28], n_parallel=n, n_threads=a.threads, store_features=not a.no_features)
        w = harvest(target, rows, tmp, s, max_seconds=a.seconds)
        report.append({"parallel": n, "seconds": round(w.seconds, 1), "response_tokens": w.n_response_written,
                       "tokens": w.n_tokens_written, "response_tok_s": round(w.n_response_written / w.seconds, 1),
                       "all_tok_s": round(w.n_tokens_written / w.seconds, 1)})
        print(json.dumps(report[-1]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps({"best_parallel": max(report, key=lambda r: r["response_tok_s"])["parallel"], "runs": report}))
