#!/usr/bin/env python3
"""A trained drafter against its target on the evaluation prompts: τ as the README measures it (train/measure.py:
greedy continuation of 128 tokens, full blocks, code raw, math and chat through the chat template) and whether
speculative greedy output (full blocks, --no-adaptive) equals plain decoding, prompt by prompt.

    python tools/trained_drafter_check.py --target gemma-3-270m-q4_k_m.gguf --drafter g.gguf --per-category 10
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.bench.tau import load_eval_prompts, measure_tau  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--target", type=Path, required=True)
ap.add_argument("--drafter", type=Path, required=True)
ap.add_argument("--eval-dir", type=Path, default=ROOT.parent / "shared" / "prompts")
ap.add_argument("--per-category", type=int, default=10)
ap.add_argument("-n", type=int, default=128, help="tokens per prompt")
ap.add_argument("-t", "--threads", type=int, default=1)
ap.add_argument("--skip-tau", action="store_true")
ap.add_argument("--skip-equality", action="store_true")
a = ap.parse_args()

rows = load_eval_prompts(a.eval_dir, a.per_category)
out = {"target": a.target.name, "drafter": a.drafter.name, "prompts_per_category": a.per_category, "n": a.n}
if not a.skip_tau:
    out |= measure_tau(a.drafter, a.target, rows, max_tokens=a.n, n_threads=a.threads).to_json()
    print(json.dumps(out), flush=True)
if a.skip_equality:
    sys.exit(0)

from dflash_gguf.engine.session import Engine  # noqa: E402
from dflash_gguf.settings import EngineSettings  # noqa: E402
from dflash_gguf.textgen.prompting import format_prompt  # noqa: E402

engine = Engine(EngineSettings(target=a.target, drafter=a.drafter, n_threads=a.threads, adaptive=False))
same = {}
try:
    for row in rows:
        tokens = format_prompt(engine.target_model, row)
        spec = engine.generate(tokens, a.n, speculative=True).tokens
        plain = engine.generate(tokens, a.n, speculative=False).tokens
        cat = row.get("category", "chat")
        ok, total = same.get(cat, (0, 0))
        same[cat] = (ok + (spec == plain), total + 1)
finally:
    engine.close()
out["greedy_equals_plain"] = {c: f"{ok}/{total}" for c, (ok, total) in same.items()}
print(json.dumps(out))
