#!/usr/bin/env python3
"""Write the training prompt set shipped with dflash-gguf (sources and licences: dflash_gguf/train/data/README.md)."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dflash_gguf.train.prompts import build  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--code", type=int, default=1500)
ap.add_argument("--math", type=int, default=1200)
ap.add_argument("--chat", type=int, default=1200)
ap.add_argument("--seed", type=int, default=20261122)
ap.add_argument("-o", "--out", type=Path, default=Path(__file__).resolve().parent.parent / "dflash_gguf/train/data/prompts.jsonl")
a = ap.parse_args()
rows = build(a.code, a.math, a.chat, a.seed)
a.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
print(f"{len(rows)} prompts -> {a.out}")
