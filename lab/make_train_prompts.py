#!/usr/bin/env python3
"""Build the training prompt set (dflash_gguf/corpus/data/prompts-v2.jsonl.gz; sources and licences in
dflash_gguf/corpus/data/README.md).

Stage 1 cuts prompts from real text on this machine: documented functions of the standard library, the
installed distributions and the wheels in --wheels (pip download --no-deps ...), Debian man pages and the
package index; a small share of template word problems. Stage 2 asks the target to write further questions
and word problems from seeds of the same sources (greedy, so reproducible for a given target file).
Every prompt sharing an 8-word run with an evaluation prompt (../shared/prompts) is dropped.
"""

import argparse
import gzip
import json
import sys
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dflash_gguf.paths import cache_root  # noqa: E402
from lab.corpus import build  # noqa: E402
from lab.corpus.overlap import eval_prompts_in  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--seed", type=int, default=20261123)
ap.add_argument("--eval", type=Path, default=ROOT.parent / "shared" / "prompts", help="evaluation prompts to exclude")
ap.add_argument("--wheels", type=Path, default=cache_root() / "prompt-sources" / "site",
                help="folder with unpacked wheels (their .dist-info names the licence)")
ap.add_argument("-m", "--model", type=Path, default=None, help="target writing the stage-2 prompts (default: SmolLM2)")
ap.add_argument("--parallel", type=int, default=16)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--self-instruct-minutes", type=float, default=None,
                help="stop stage 2 after this long (it resumes where it stopped on the next run)")
ap.add_argument("-o", "--out", type=Path, default=ROOT / "dflash_gguf/corpus/data/prompts-v2.jsonl.gz")
for f in fields(build.Mix):
    ap.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=f.default)
a = ap.parse_args()

eval_prompts = eval_prompts_in(a.eval)
if not eval_prompts:
    sys.exit(f"{a.eval}: no evaluation prompts (*.jsonl) to exclude; pass --eval")
mix = build.Mix(**{f.name: getattr(a, f.name) for f in fields(build.Mix)})
rows, requests = build.source_rows(mix, a.seed, eval_prompts, [a.wheels] if a.wheels.is_dir() else [])
print(f"stage 1: {len(rows)} prompts, {len(requests)} self-instruct requests", file=sys.stderr)

if requests:
    from dflash_gguf.native.wrappers import Model  # noqa: E402
    from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402
    from dflash_gguf.target_file import TargetFile  # noqa: E402
    from dflash_gguf.train.harvest import HarvestSettings, harvest  # noqa: E402
    target = a.model or smollm2_q4_1()
    work = cache_root() / "prompt-sources" / f"self-instruct-{a.seed}"
    settings = HarvestSettings(taps=[1], n_parallel=a.parallel, n_threads=a.threads, sampled_fraction=0.0,
                               store_features=False, top_k_probs=0, max_new={"math": 96, "chat": 64}, seed=a.seed)
    harvest(TargetFile.open(target), requests, work, settings,
            max_seconds=a.self_instruct_minutes * 60 if a.self_instruct_minutes is not None else None)
    tokens = __import__("numpy").fromfile(work / "tokens.bin", dtype="int32")
    model = Model(target)
    replies = {}
    for line in (work / "index.jsonl").read_text().splitlines():
        r = json.loads(line)
        s, e = r["spans"][0]
        replies[r["prompt_index"]] = model.detokenize(tokens[r["offset"] + s:r["offset"] + e].tolist())
    model.close()
    rows = build.clean(rows + build.self_instructed_rows(requests, replies), eval_prompts, a.seed)
    print(f"stage 2: {len(rows)} prompts ({len(replies)} of {len(requests)} requests answered)", file=sys.stderr)

with gzip.open(a.out, "wt", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
print(json.dumps(build.summary(rows), indent=2))
