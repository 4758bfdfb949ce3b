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
from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402
from dflash_gguf.target_file import TargetFile  # noqa: E402
from dflash_gguf.train.harvest import HarvestSettings, harvest  # noqa: E402
from dflash_gguf.corpus.prompts import load  # noqa: E402
from lab.smollm2_recipe import TAPS  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("-m", "--model", type=Path, default=None, help="target GGUF (default: embedded SmolLM2)")
ap.add_argument("--prompts", type=Path, default=Path(__file__).resolve().parent.parent / "dflash_gguf/corpus/data/prompts.jsonl")
ap.add_argument("--parallel", type=int, nargs="+", default=[8, 16, 32, 64])
ap.add_argument("--seconds", type=float, default=60.0)
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--no-features", action="store_true", help="keep tokens and top-k only")
ap.add_argument("--prefill", type=Path, default=None, help="instead: how fast a batched prefill recomputes the "
                "features of this dataset's sequences (the alternative to storing them)")
a = ap.parse_args()

if a.prefill:
    import time  # noqa: E402

    import numpy as np  # noqa: E402

    from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, Model  # noqa: E402
    from dflash_gguf.textgen.greedy import prefill_features  # noqa: E402
    from dflash_gguf.train.dataset import FeatureDataset  # noqa: E402
    data = FeatureDataset(a.prefill)
    model = Model(a.model or smollm2_q4_1())
    ctx = Context(model, ContextSettings(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=a.threads))
    batch = Batch(model.native, 512)
    t0, n, err = time.time(), 0, []
    for r in data.index:
        if time.time() - t0 > a.seconds:
            break
        seq = np.asarray(data.tokens[r["offset"]:r["offset"] + r["length"]]).tolist()
        feats = prefill_features(ctx, batch, data.taps, seq)
        stored = np.asarray(data.feats[r["offset"]:r["offset"] + r["length"] - 1], np.float32)
        err.append(np.linalg.norm(feats[:-1] - stored) / np.linalg.norm(stored))
        n += len(seq)
    sec = time.time() - t0
    width = 2 * len(data.taps) * data.meta["n_embd"]
    print(json.dumps({"prefill_tok_s": round(n / sec, 1), "tokens": n, "seconds": round(sec, 1),
                      "stored_bytes_per_token": width + 4, "tokens_only_bytes_per_token": 4,
                      "relative_difference_vs_stored_features": float(f"{np.median(err):.2e}")}))
    sys.exit(0)

target = a.model or smollm2_q4_1()
rows = load(a.prompts)
report = []
for n in a.parallel:
    tmp = Path(tempfile.mkdtemp(prefix="harvest-tp-"))
    try:
        s = HarvestSettings(taps=TAPS, n_parallel=n, n_threads=a.threads, store_features=not a.no_features)
        w = harvest(TargetFile.open(target), rows, tmp, s, max_seconds=a.seconds)
        report.append({"parallel": n, "seconds": round(w.seconds, 1), "response_tokens": w.n_response_written,
                       "tokens": w.n_tokens_written, "response_tok_s": round(w.n_response_written / w.seconds, 1),
                       "all_tok_s": round(w.n_tokens_written / w.seconds, 1)})
        print(json.dumps(report[-1]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps({"best_parallel": max(report, key=lambda r: r["response_tok_s"])["parallel"], "runs": report}))
