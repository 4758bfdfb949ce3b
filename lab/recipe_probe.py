#!/usr/bin/env python3
"""Compare training recipes at one labelled-row budget: validation loss and τ of the default drafter (2 layers,
block 8, 4096-token draft vocabulary) for each --recipe ANCHORS:SEQS_PER_STEP:LR, one JSON line each.

Validation only (held-out sequences of the same harvest, no engine run): for choosing a recipe before a long run.
Example (the comparison behind TrainSettings' defaults, README "Training"):
  lab/recipe_probe.py --data ~/.cache/dflash-gguf/datasets/<dataset> --rows 250000 \\
      --recipe 48:4:8e-4 48:1:8e-4 48:1:2e-3 48:4:2.5e-3 24:1:8e-4 48:1:1.3e-3 12:1:8e-4
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
from lab import smollm2_recipe as recipe  # noqa: E402
from dflash_gguf.train.dataset import FeatureDataset  # noqa: E402
from dflash_gguf.target_file import TargetFile  # noqa: E402
from dflash_gguf.train.pipeline import build_trainer  # noqa: E402
from dflash_gguf.train.trainer import TrainSettings  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--data", type=Path, required=True, help="harvested dataset folder")
ap.add_argument("--rows", type=int, default=250_000)
ap.add_argument("--recipe", nargs="+", required=True, help="ANCHORS:SEQS_PER_STEP:LR")
ap.add_argument("--val-seqs", type=int, default=144)
ap.add_argument("--threads", type=int, default=0)
a = ap.parse_args()

import torch  # noqa: E402

if a.threads:
    torch.set_num_threads(a.threads)
data = FeatureDataset(a.data)
for recipe in a.recipe:
    anchors, seqs, lr = recipe.split(":")
    s = TrainSettings(n_layers=recipe.N_LAYERS, block_size=recipe.BLOCK_SIZE, rows=a.rows, lr=float(lr), warmup=0.03,
                      anchors_per_seq=int(anchors), seqs_per_step=int(seqs), eval_every=10**9, eval_seqs=a.val_seqs,
                      seed=recipe.SEED)
    trainer, _ = build_trainer(TargetFile.open(smollm2_q4_1()), data, s, draft_vocab=recipe.DRAFT_VOCAB)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        val = trainer.train(Path(tmp), progress=False)
    print(json.dumps({"anchors_per_seq": s.anchors_per_seq, "seqs_per_step": s.seqs_per_step, "lr": s.lr,
                      "rows": trainer.rows_seen, "steps": trainer.step, "seconds": round(time.time() - t0),
                      "val_loss": round(val.loss, 4), "val_tau": round(val.tau, 3),
                      "val_slot_accept": [round(x, 3) for x in val.slot_accept]}), flush=True)
