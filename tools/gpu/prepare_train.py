#!/usr/bin/env python3
"""On the CPU machine, before a GPU window: the shipped prompt set as SmolLM2 reads it (token ids, chat
template applied) -> .gpu-bundle/train-prompts.npz, carried to the GPU machine for tools/gpu/train.sh."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402
from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS  # noqa: E402
from dflash_gguf.corpus.prompts import load  # noqa: E402
from lab.torch_target import pretokenize  # noqa: E402

import argparse  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--out", type=Path, default=ROOT / ".gpu-bundle" / "train-prompts.npz")
ap.add_argument("--limit", type=int, default=None, help="only the first N prompts (dry runs)")
a = ap.parse_args()
a.out.parent.mkdir(parents=True, exist_ok=True)
print(pretokenize(smollm2_q4_1(), load(DEFAULT_PROMPTS)[:a.limit], a.out), f"{a.out.stat().st_size / 2**20:.1f} MiB")
