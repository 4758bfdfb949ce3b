#!/usr/bin/env python3
"""Does a DSpark drafter's confidence head help the draft-length policy? The same drafter, adaptive policy on,
with the head trimming each drafted block (`Proposal.confidence` → `DraftLengthPolicy.trim`) and without
(the default; `--draft-confidence` turns it on), prompt by prompt in one process, greedy (outputs must be identical).

Per arm: tokens per target call (τ), drafts verified / trimmed / accepted, wall time of the generations and the
time the calibrated cost curve predicts for the calls made (t_draft + t(k+1) per step, t(1) per plain step):
the second is free of a shared machine's noise.

    .venv/bin/python lab/confidence_ab.py drafter.gguf --per-category 10 --threads 1
"""

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.engine.sampling import SamplingParams  # noqa: E402
from dflash_gguf.engine.session import Engine  # noqa: E402
from dflash_gguf.settings import EngineSettings  # noqa: E402
from dflash_gguf.textgen.prompting import format_prompt  # noqa: E402
from dflash_gguf.bench.prompts import read_rows  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("drafter", type=Path)
ap.add_argument("--prompts", type=Path, default=ROOT.parent / "shared" / "prompts")
ap.add_argument("--per-category", type=int, default=10)
ap.add_argument("--tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()

engines = {arm: Engine(EngineSettings(drafter=a.drafter, n_threads=a.threads, draft_confidence=arm == "confidence"))
           for arm in ("confidence", "no confidence")}
assert engines["confidence"].policy.use_confidence, f"{a.drafter}: no confidence head the engine can use"
cost = copy.deepcopy(engines["no confidence"].cost)    # one fixed curve prices both arms' calls


modeled = {arm: 0.0 for arm in engines}


def priced(arm: str, observe):
    """Wrap the policy's observe: every step adds t(k+1) of its verify and t_draft if it drafted."""
    def wrapped(n_drafted, n_accepted, verify_s=None, draft_s=None, draft_n=None):
        modeled[arm] += cost.verify(n_drafted + 1) + (cost.t_draft if draft_s is not None else 0.0)
        return observe(n_drafted, n_accepted, verify_s, draft_s, draft_n)
    return wrapped


for arm, engine in engines.items():
    engine.policy.observe = priced(arm, engine.policy.observe)

totals = {arm: {} for arm in engines}
for row in read_rows(sorted(a.prompts.glob("*.jsonl")), a.per_category):
    cat = row.get("category", "all")
    outs = {}
    for arm, engine in engines.items():
        prompt = format_prompt(engine.target_model, row)
        t0, m0 = time.perf_counter(), modeled[arm]
        res = engine.generate(prompt, a.tokens, SamplingParams())
        wall = time.perf_counter() - t0
        outs[arm] = res.tokens
        t = totals[arm].setdefault(cat, {"tokens": 0, "calls": 0, "drafted": 0, "trimmed": 0, "accepted": 0,
                                         "wall_s": 0.0, "modeled_s": 0.0})
        t["tokens"] += len(res.tokens) - 1
        t["calls"] += res.n_target_calls
        t["drafted"] += res.n_drafted
        t["trimmed"] += res.n_trimmed
        t["accepted"] += res.n_accepted
        t["wall_s"] += wall
        t["modeled_s"] += modeled[arm] - m0
    assert outs["confidence"] == outs["no confidence"], f"{row.get('id')}: outputs differ"

for arm, cats in totals.items():
    all_ = {k: sum(c[k] for c in cats.values()) for k in next(iter(cats.values()))}
    for name, t in list(cats.items()) + [("overall", all_)]:
        print(json.dumps({"arm": arm, "category": name, "tau": round(t["tokens"] / t["calls"], 3),
                          "verified": t["drafted"], "trimmed": t["trimmed"], "accepted": t["accepted"],
                          "tok_s_wall": round(t["tokens"] / t["wall_s"], 1),
                          "tok_s_modeled": round(t["tokens"] / t["modeled_s"], 1)}))
