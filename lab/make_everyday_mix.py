#!/usr/bin/env python3
"""A prompt file to continue a drafter on everyday requests: the everyday chat requests and the longer word
problems of lab/corpus (templates and topic lists written for this project, MIT), with a replay of the part of
the shipped prompt set the shipped drafter was trained on, so that it keeps what it knew. Every row is checked
against the evaluation prompts (../shared/prompts: no shared 8-word run)."""

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS, TRAINED_PART, load  # noqa: E402
from lab.corpus import build, everyday, word_problems  # noqa: E402
from lab.corpus.overlap import eval_prompts_in  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--out", type=Path, required=True)
ap.add_argument("--everyday", type=int, default=2400)
ap.add_argument("--stories", type=int, default=720)
ap.add_argument("--replay", type=int, default=1500, help="prompts of the shipped set's trained part")
ap.add_argument("--multi-turn", type=float, default=0.25, help="share of everyday rows given a follow-up turn")
ap.add_argument("--seed", type=int, default=20261130)
ap.add_argument("--eval", type=Path, default=ROOT.parent / "shared" / "prompts")
a = ap.parse_args()

eval_prompts = eval_prompts_in(a.eval)
if not eval_prompts:
    sys.exit(f"{a.eval}: no evaluation prompts (*.jsonl) to exclude; pass --eval")
rng = random.Random(a.seed)
fresh = everyday.everyday_rows(a.everyday, rng)
for r in rng.sample(fresh, int(a.multi_turn * len(fresh))):
    r["followups"] = [rng.choice(build.FOLLOWUPS)]
fresh += word_problems.story_problem_rows(a.stories, rng)
replay = rng.sample(load(DEFAULT_PROMPTS)[:TRAINED_PART], a.replay)
rows = build.clean(fresh + replay, eval_prompts, a.seed)
text = "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")
a.out.write_bytes(gzip.compress(text, compresslevel=9, mtime=0) if a.out.suffix == ".gz" else text)
print(json.dumps(build.summary(rows)), f"dropped {len(fresh) + len(replay) - len(rows)}")
