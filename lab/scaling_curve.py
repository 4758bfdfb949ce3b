#!/usr/bin/env python3
"""The scaling curve of the default drafter: engine τ and validation τ against training compute, data size
and prompt diversity; writes docs/scaling.json and docs/scaling.png (resumable: points already in the JSON
are kept).

Compute series: the same data, budgets of --rows labelled rows (each a full schedule), one series per training
recipe (--series, with --anchors / --seqs-per-step / --lr); the extrapolation is fitted on the recipe whose largest
run reached the highest τ. Data-size series: a
fraction of the training sequences at --same-rows. Diversity series: only the least diverse sources (template
word problems, plus the standard library for code) at the same number of tokens as a random subset.
τ is measured with the real engine (llama.cpp) on the first --eval-prompts of each ../shared/prompts category,
greedy, 128 tokens, block 8, chat template for math and chat, on the Q4_1 target.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402
from dflash_gguf.bench.prompts import read_rows  # noqa: E402
from dflash_gguf.bench.tau import measure_tau  # noqa: E402
from dflash_gguf.target_file import TargetFile  # noqa: E402
from dflash_gguf.train.pipeline import build_trainer, export  # noqa: E402
from lab.scaling import (SubsetDataset, best_compute_series, extrapolate, measured,  # noqa: E402
                                       plot_curve)
from dflash_gguf.train.trainer import TrainSettings  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--data", type=Path, default=None, help="harvested dataset folder (for the points trained here)")
ap.add_argument("--rows", type=int, nargs="*", default=[6000, 20000, 60000, 200000])
ap.add_argument("--series", default="compute", help="name of this recipe's compute series (starts with 'compute')")
ap.add_argument("--anchors", type=int, default=48, help="anchor blocks per sequence per step")
ap.add_argument("--seqs-per-step", type=int, default=4)
ap.add_argument("--lr", type=float, default=8e-4)
ap.add_argument("--same-rows", type=int, default=60000, help="budget of the data-size and diversity points")
ap.add_argument("--fractions", type=float, nargs="*", default=[0.1])
ap.add_argument("--diversity", action="store_true", help="add the low-diversity point")
ap.add_argument("--distill", type=float, default=None, help="add a point with this distillation share at --same-rows")
ap.add_argument("--points", type=Path, nargs="*", default=[], help="snapshots.json of a run of "
                "lab/train_default_drafter.py --snapshots, added as --series")
ap.add_argument("--short-blocks", type=float, default=0.0)
ap.add_argument("--extra", type=Path, nargs="*", default=[], help="train-record JSONs of longer runs to include")
ap.add_argument("--merge", type=Path, nargs="*", default=[], help="scaling JSONs of runs made side by side")
ap.add_argument("--eval", type=Path, default=ROOT.parent / "shared" / "prompts")
ap.add_argument("--eval-prompts", type=int, default=10)
ap.add_argument("--draft-vocab", type=int, default=4096)
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--out", type=Path, default=ROOT / "docs" / "scaling.json")
a = ap.parse_args()

import torch  # noqa: E402

if a.threads:
    torch.set_num_threads(a.threads)
target = smollm2_q4_1()
prompts = read_rows(sorted(a.eval.glob("*.jsonl")), a.eval_prompts)
if not prompts:
    sys.exit(f"{a.eval}: no evaluation prompts")
report = json.loads(a.out.read_text()) if a.out.exists() else {"points": []}
done = {(p["series"], p["label"]) for p in report["points"]}
LOW_DIVERSITY = ("template:", "cpython:")


def settings(rows: int, distill: float = 0.0) -> TrainSettings:
    return TrainSettings(n_layers=2, block_size=8, rows=rows, lr=a.lr, warmup=0.03, anchors_per_seq=a.anchors,
                         seqs_per_step=a.seqs_per_step, eval_every=10**9, eval_seqs=48, seed=1, distill=distill,
                         short_blocks=a.short_blocks)


def record(series: str, label: str, trainer, data, tau, val, seconds: float) -> None:
    rec = {"series": series, "label": label, "rows": trainer.rows_seen,
           "train_seconds": round(seconds, 1), "rows_per_s": round(trainer.rows_seen / max(seconds, 1e-9), 1),
           "train_sequences": len(data.split()[0]),
           "train_tokens": data.n_tokens(data.split()[0]),
           **measured(tau, val), "eval_prompts_per_category": a.eval_prompts,
           "recipe": {"anchors_per_seq": a.anchors, "seqs_per_step": a.seqs_per_step, "lr": a.lr,
                      "short_blocks": a.short_blocks}}
    report["points"].append(rec)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(rec), flush=True)


def point(series: str, label: str, rows: int, keep=None, distill: float = 0.0) -> None:
    if (series, label) in done:
        return
    if a.data is None:
        sys.exit(f"--data: needed to train the point '{series}: {label}'")
    data = SubsetDataset(a.data, keep or (lambda i, r: True))
    trainer, vocab = build_trainer(TargetFile.open(target), data, settings(rows, distill), a.draft_vocab)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        val = trainer.train(Path(tmp) / "ck", progress=False)
        seconds = time.time() - t0
        out = Path(tmp) / "draft.gguf"
        export(trainer, TargetFile.open(target), out, {"labelled_rows": trainer.rows_seen}, vocab)
        tau = measure_tau(out, target, prompts, max_tokens=128, n_threads=a.threads or 0)
    record(series, label, trainer, data, tau, val, seconds)


for rows in a.rows:
    point(a.series, f"{rows} rows", rows)
for frac in a.fractions:
    point("data size", f"{frac:.0%} of the data", a.same_rows, lambda i, r, f=frac: (i * 0.6180339887) % 1 < f)
if a.distill is not None:
    point("distillation", f"distill {a.distill:g}", a.same_rows, distill=a.distill)
if a.diversity and a.data is not None:
    full = SubsetDataset(a.data, lambda i, r: True)
    narrow_ids = {i for i in full.split()[0] if str(full.index[i].get("source", "")).startswith(LOW_DIVERSITY)}
    narrow_tokens = full.n_tokens(sorted(narrow_ids))
    frac = narrow_tokens / max(1, full.n_tokens(full.split()[0]))
    point("diversity", f"templates + stdlib only ({narrow_tokens} tokens)", a.same_rows,
          lambda i, r: i in narrow_ids)
    point("diversity", f"all sources, same tokens ({frac:.0%})", a.same_rows,
          lambda i, r, f=frac: (i * 0.6180339887) % 1 < f)
for extra in a.extra:
    r = json.loads(extra.read_text())
    rows = r.get("labelled_rows_in_all", r["labelled_rows"])        # a continued drafter counts from the first
    label = f"{rows} rows (train run)"
    if (a.series, label) not in done and "engine_tau" in r:
        ts = r.get("train_settings", {})
        walk = {"val_anchor_tau": round(r["val_anchor_tau"], 3), "val_tau_counted": "walk"} if "val_anchor_tau" in r else {}
        report["points"].append({"series": a.series, "label": label, "rows": rows,
                                 "train_tokens": r.get("response_tokens_in_all", r.get("response_tokens")),
                                 "train_seconds": r["train_seconds"], "rows_per_s": r["rows_per_second"],
                                 "tau": r["engine_tau"]["tau_overall"], "tau_by_category": r["engine_tau"]["tau"],
                                 "slot_accept": r["engine_tau"]["slot_accept"], "val_tau": round(r["val_tau_estimate"], 3),
                                 "val_loss": round(r["val_loss"], 4),
                                 "recipe": {"anchors_per_seq": ts.get("anchors_per_seq"),
                                            "seqs_per_step": ts.get("seqs_per_step"), "lr": ts.get("lr")}}
                                | walk | ({"init_drafter": r["init_drafter"]["file"]} if r.get("init_drafter") else {}))
for path in a.points:                 # snapshots of a long run (lab/train_default_drafter.py --snapshots)
    seen = {(p["series"], p["label"]) for p in report["points"]}
    report["points"] += [p | {"series": a.series} for p in json.loads(path.read_text())
                         if (a.series, p["label"]) not in seen]
for other in a.merge:                 # points measured by another run of this tool (side by side)
    seen = {(p["series"], p["label"]) for p in report["points"]}
    report["points"] += [p for p in json.loads(other.read_text())["points"] if (p["series"], p["label"]) not in seen]
compute = sorted((p for p in report["points"] if p["series"].startswith("compute")), key=lambda p: (p["series"], p["rows"]))
same = [p for p in compute if p["series"] == "compute" and p["label"] == f"{a.same_rows} rows"]
if same and any(p["series"] == "distillation" for p in report["points"]) and ("distillation", "hard labels") not in {
        (p["series"], p["label"]) for p in report["points"]}:
    report["points"].append(same[0] | {"series": "distillation", "label": "hard labels"})   # the same run
report["points"] = compute + [p for p in report["points"] if not p["series"].startswith("compute")]
best = best_compute_series(compute)
fitted = [p for p in compute if p["series"] == best]
if len(fitted) < 2:
    a.out.write_text(json.dumps(report, indent=2))
    sys.exit(0)
rate = max(p["rows_per_s"] for p in fitted)   # the best rate measured with this recipe (least contended run)
report["extrapolation"] = extrapolate(fitted, rate) | {"series": best}
report["extrapolation"]["note"] = (f"least-squares fits through the '{best}' points, extended past the largest "
                                   f"run; CPU hours at the best rows/s measured with that recipe ({rate:.0f} rows/s, "
                                   "2 threads of a 2-core EPYC)")
report["eval"] = {"prompts": f"first {a.eval_prompts} per category of ../shared/prompts", "max_tokens": 128,
                  "block": 8, "greedy": True, "target": target.name}
a.out.write_text(json.dumps(report, indent=2))
plot_curve(report, a.out.with_suffix(".png"))
print(json.dumps(report["extrapolation"], indent=2))
