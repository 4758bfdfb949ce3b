#!/usr/bin/env python3
"""A/B of training objectives at equal compute on the embedded default (SmolLM2-135M-Instruct Q4_1).

Every arm continues the same drafter (default: the shipped one) for the same labelled rows of the same harvest,
with the same schedule, and differs only in its loss (or, for the Markov arms, in an added DSpark Markov head,
which starts as a no-op); each is judged by engine τ on the first --eval-prompts prompts per category of
../shared/prompts (greedy, block 8, 128 tokens). The baseline runs with two seeds, so
the table shows the spread training noise alone gives. Resumable: an arm with a result is not trained again,
and an interrupted arm resumes from its checkpoint. Results: <user cache>/recipe-ab/results.json, and a Markdown
table on stdout.

  lab/recipe_ab.py --tokens 120000 --rows 200000
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.paths import cache_root  # noqa: E402

SHIPPED = ROOT / "dflash_gguf" / "assets" / "smollm2-135m-instruct.dflash-q8_0.gguf"
ARMS = {
    "ce γ=4 (shipped recipe)": [],
    "ce γ=4, seed 2": ["--train-seed", "2"],
    "ce uniform slot weights": ["--gamma", "1e9"],
    "first-error cut": ["--cut-at-first-error"],
    "first-error cut, seed 2": ["--cut-at-first-error", "--train-seed", "2"],
    "first-error cut + TV 0.9": ["--cut-at-first-error", "--tv", "0.9"],
    "first-error cut + TV 0.9, seed 2": ["--cut-at-first-error", "--tv", "0.9", "--train-seed", "2"],
    "TV 0.9 + CE 0.1": ["--tv", "0.9"],
    "top-8 KL 0.5 + CE 0.5": ["--distill", "0.5"],
    "slots 1-3 only": ["--supervised-slots", "3"],
    # anchors per sequence and drafter depth, each with the best objective so far
    "first-error cut + TV 0.9, 6 anchors per sequence": ["--cut-at-first-error", "--tv", "0.9", "--anchors", "6"],
    "first-error cut + TV 0.9, 24 anchors per sequence": ["--cut-at-first-error", "--tv", "0.9", "--anchors", "24"],
    "first-error cut + TV 0.9, 1 layer": ["--cut-at-first-error", "--tv", "0.9", "--n-layers", "1"],
    "first-error cut + TV 0.9, 3 layers": ["--cut-at-first-error", "--tv", "0.9", "--n-layers", "3"],
    # DSpark: the Markov head on the same backbone; rank 64 for a 576-wide drafter is DeepSpec's 256 for 2560
    "Markov head r64": ["--markov-rank", "64"],
    "first-error cut + TV 0.9 + Markov head r64": ["--cut-at-first-error", "--tv", "0.9", "--markov-rank", "64"],
    "first-error cut + TV 0.9 + Markov head r64, seed 2": ["--cut-at-first-error", "--tv", "0.9", "--markov-rank", "64",
                                                           "--train-seed", "2"],
}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--tokens", type=int, default=120_000, help="harvest until the dataset holds this many tokens")
ap.add_argument("--rows", type=int, default=200_000, help="labelled rows each arm trains on")
ap.add_argument("--lr", type=float, default=3e-4)
ap.add_argument("--init-drafter", default=str(SHIPPED), help="the drafter every arm continues; none: every arm "
                "starts from the target's last layers")
ap.add_argument("--eval-prompts", type=int, default=10)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--arms", nargs="*", default=list(ARMS), help="which arms (names as in the table)")
a = ap.parse_args()

work = cache_root() / "recipe-ab"
work.mkdir(parents=True, exist_ok=True)
results_path = work / "results.json"
results = json.loads(results_path.read_text()) if results_path.exists() else {}
trainer = [sys.executable, str(ROOT / "tools" / "train_default_drafter.py"), "--threads", str(a.threads)]

from_target = a.init_drafter == "none"
start = "target layers" if from_target else Path(a.init_drafter).name
start_flags = [] if from_target else ["--init-drafter", a.init_drafter]

subprocess.run(trainer + ["--harvest-only", "--tokens", str(a.tokens)], check=True)
for name in a.arms:
    key = f"{name} | rows {a.rows} | lr {a.lr} | from {start}"
    if key in results:
        continue
    arm_dir = work / "".join(c if c.isalnum() else "-" for c in f"{name}-{start}-{a.rows}")
    cmd = trainer + ["--harvest-minutes", "0", "--tokens", str(a.tokens), "--rows", str(a.rows), "--lr", str(a.lr),
                     *start_flags, "--eval-prompts", str(a.eval_prompts),
                     "--work-dir", str(arm_dir), "--out", str(arm_dir / "drafter.gguf"), *ARMS[name]]
    if (arm_dir / "checkpoint" / "ckpt.pt").exists():
        cmd.append("--resume")
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    report = json.loads(out[out.rindex('{\n  "labelled_rows"'):])
    results[key] = {"arm": name, "flags": ARMS[name], "rows": a.rows, "lr": a.lr, "tokens": a.tokens,
                    "init_drafter": start, "val_tau": report["val_tau_estimate"],
                    "engine_tau": report["engine_tau"]}
    results_path.write_text(json.dumps(results, indent=2))

print("| start | rows | arm | engine τ overall | code | math | chat | slot-1 acceptance | validation τ |")
print("|---|---|---|---|---|---|---|---|---|")
for r in results.values():
    tau = r["engine_tau"]
    print(f"| {r['init_drafter']} | {r['rows']:,} | {r['arm']} | {tau['tau_overall']:.3f} | {tau['tau']['code']:.3f} | {tau['tau']['math']:.3f} | "
          f"{tau['tau']['chat']:.3f} | {tau['slot_accept'][0]:.3f} | {r['val_tau']:.3f} |")
