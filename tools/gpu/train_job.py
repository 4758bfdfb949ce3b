#!/usr/bin/env python3
"""Drafter training on the lent GPU, in one command of at most ~9 minutes (run by tools/gpu/train.sh).

The target runs in torch from its GGUF (llama.cpp is still being built beside it), harvesting the shipped
prompt set pre-tokenized on the CPU machine (tools/gpu/prepare_train.py); then the drafter trains on the GPU.
Brings back in $OUT: the drafter GGUF (Q8_0, 4096-token draft vocabulary), the harvested tokens (for
`dflash-gguf train --import-tokens` on a CPU: features are recomputed there by a batched prefill) and
train-job.json with what was measured. Resumable: a second call continues the harvest, and trains on only when
--train-seconds exceeds the seconds already trained (the cosine then runs over the new total).
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS  # noqa: E402
from dflash_gguf.train.dataset import FeatureDataset  # noqa: E402
from lab import smollm2_recipe as recipe  # noqa: E402
from dflash_gguf.train.pipeline import (build_trainer, export, file_sha256, prompts_sha256,  # noqa: E402
                                        training_record)
from dflash_gguf.corpus.prompts import load  # noqa: E402
from dflash_gguf.target_file import TargetFile  # noqa: E402
from dflash_gguf.train.refeature import export_tokens  # noqa: E402
from lab.torch_target import load_pretokenized, torch_harvest  # noqa: E402
from dflash_gguf.train.trainer import TrainSettings  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("out", type=Path)
ap.add_argument("--target", type=Path, required=True)
ap.add_argument("--prompts-npz", type=Path, required=True)
ap.add_argument("--state", type=Path, default=ROOT / ".gpu-state" / "train")
ap.add_argument("--harvest-seconds", type=float, default=240)
ap.add_argument("--train-seconds", type=float, default=200)
ap.add_argument("--parallel", type=int, default=384)
ap.add_argument("--rows", type=int, default=10**10, help="a cap on labelled rows (the schedule runs over "
                "--train-seconds)")
ap.add_argument("--device", default="cuda")
ap.add_argument("--tv", type=float, default=0.9, help="share of the loss that is the total variation to the top-8")
ap.add_argument("--no-cut", action="store_true", help="keep the loss after a block's first wrong slot")
ap.add_argument("--limit", type=int, default=None, help="only the first N prompts (dry runs)")
ap.add_argument("--max-new", type=int, default=None, help="tokens per response (default: 128 code, 160 others)")
a = ap.parse_args()

t_start = time.time()


def say(msg: str) -> None:
    """Progress on stderr (a step that times out still shows how far it got)."""
    print(f"[train_job {time.time() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)


prompts = load(DEFAULT_PROMPTS)[:a.limit]
tokens, eog = load_pretokenized(a.prompts_npz)
if len(tokens) < len(prompts) or (a.limit is None and len(tokens) != len(prompts)):
    sys.exit(f"{a.prompts_npz}: {len(tokens)} prompts, the shipped set has {len(prompts)}; rerun prepare_train.py")
say(f"{len(prompts)} prompts, {len(tokens)} pre-tokenized; harvesting for up to {a.harvest_seconds:.0f} s")
data_dir = a.state / "data"
harvest = recipe.harvest_settings(a.max_new, n_parallel=a.parallel)
w = torch_harvest(a.target, prompts, tokens, eog, data_dir, harvest, device=a.device,
                  dtype="bfloat16" if a.device == "cuda" else "float32", max_seconds=a.harvest_seconds,
                  meta_extra={"target_sha256": file_sha256(a.target), "prompts_sha256": prompts_sha256(prompts)})
harvest_s = time.time() - t_start
say(f"harvest: {w.n_response_written} response tokens this call")
data = FeatureDataset(data_dir)
# the CPU recipe's objective (docs/training-ab.md: TV to the target's top-8 + first-error cut), with the GPU's
# bigger steps; the cosine runs over the seconds this call trains, whatever the rows per second turn out to be
settings = TrainSettings(n_layers=recipe.N_LAYERS, block_size=recipe.BLOCK_SIZE, rows=a.rows, lr=8e-4, warmup=0.03,
                         anchors_per_seq=96, seqs_per_step=16, seed=recipe.SEED, device=a.device,
                         schedule_seconds=a.train_seconds, eval_every=400, eval_seqs=64, ckpt_minutes=2.0,
                         distill=0.0, tv=a.tv, cut_at_first_error=not a.no_cut)
target = TargetFile.open(a.target)
trainer, vocab = build_trainer(target, data, settings, draft_vocab=recipe.DRAFT_VOCAB)
target.release_model()
ckpt = a.state / "checkpoint"
if (ckpt / "ckpt.pt").exists():
    trainer.resume(ckpt)
say(f"training {len(data.index)} sequences for {a.train_seconds:.0f} s")
result = trainer.train(ckpt, progress=False)
say(f"trained {trainer.rows_seen} rows")
a.out.mkdir(parents=True, exist_ok=True)
record = {"target": a.target.name, **training_record(trainer, result),
          "sequences": len(data.index), "response_tokens": data.n_tokens(list(range(len(data.index)))),
          "harvest_this_call": {"seconds": round(harvest_s, 1), "response_tokens": w.n_response_written,
                                "response_tok_s": round(w.n_response_written / max(harvest_s, 1e-9), 1)},
          "device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"}
export(trainer, target, a.out / "smollm2-dflash-gpu.gguf", record, vocab)
target.close()
export_tokens(data_dir, a.out / "gpu-harvest-tokens.npz")
(a.out / "train-job.json").write_text(json.dumps(record, indent=2))
print(json.dumps(record, indent=2))
