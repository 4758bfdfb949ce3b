#!/usr/bin/env python3
"""Does the drafter we train (torch, trainer.py) propose what the engine's drafter (llama.cpp) proposes?

For each prompt the target writes its greedy continuation; its tapped features come from one prefill. Then
at every anchor of the continuation both implementations draft a block from the same features: llama.cpp
through the `dflash` graph of the GGUF (features injected into its KV, as the engine does), torch through
the trainer's own forward (the packed blocks validation uses). Printed: per-slot agreement of the two
argmaxes, and τ of each counted two ways — walking the continuation as a greedy run does (what the engine
and `measure.py` report) and averaged over every anchor (what validation used to report).

A train/inference mismatch shows as low agreement; equal walks with a higher anchor average show that the
gap between validation τ and engine τ is the way they were counted, not the drafter.

  lab/drafter_agreement.py                          # shipped drafter, first 5 prompts per category
  lab/drafter_agreement.py --train-prompts 4000:4030  # held-out training-distribution prompts instead
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402

DRAFTER = ROOT / "dflash_gguf" / "assets" / "smollm2-135m-instruct.dflash-q8_0.gguf"
EVAL = ROOT.parent / "shared" / "prompts"

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--drafter", type=Path, default=DRAFTER)
ap.add_argument("--target", type=Path, default=None, help="default: the embedded SmolLM2 Q4_1")
ap.add_argument("--per-category", type=int, default=5, help="prompts per category of ../shared/prompts")
ap.add_argument("--train-prompts", default=None, help="A:B: prompts A..B-1 of the shipped training set instead")
ap.add_argument("-n", "--max-tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--json", type=Path, default=None)
a = ap.parse_args()

import torch  # noqa: E402

from dflash_gguf.convert.checkpoint_formats import read_source  # noqa: E402
from dflash_gguf.target_file import TargetFile  # noqa: E402
from dflash_gguf.drafter.torch_ref import DFlashDrafter  # noqa: E402
from dflash_gguf.textgen.prompting import format_prompt  # noqa: E402
from dflash_gguf.engine.acceptance import Walk, leading_correct  # noqa: E402
from dflash_gguf.train.dataset import FeatureDataset  # noqa: E402
from dflash_gguf.train.harvest import DatasetWriter  # noqa: E402
from dflash_gguf.bench.tau import NativeDraftProbe  # noqa: E402
from dflash_gguf.train.frozen_weights import embedding_and_head  # noqa: E402

if a.threads:
    torch.set_num_threads(a.threads)
target = a.target or smollm2_q4_1()
if a.train_prompts:
    from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS  # noqa: E402
    from dflash_gguf.corpus.prompts import load  # noqa: E402
    lo, hi = (int(x) for x in a.train_prompts.split(":"))
    prompts = load(DEFAULT_PROMPTS)[lo:hi]
else:
    from dflash_gguf.bench.prompts import read_rows  # noqa: E402
    prompts = read_rows(sorted(EVAL.glob("*.jsonl")), a.per_category)

target_file = TargetFile.open(target)
source = read_source(str(a.drafter), target_file)
config = source.config
drafter = DFlashDrafter(config)
drafter.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in source.tensors.items()
                         if k in drafter.state_dict()})
drafter.eval()
embed, head = embedding_and_head(target_file)
vocab = source.draft_vocab.token_ids if source.draft_vocab is not None else np.arange(head.shape[0])
head_rows = torch.from_numpy(head[vocab])
embed_t = torch.from_numpy(embed)
B = config.block_size

probe = NativeDraftProbe(target, a.drafter, a.threads)
tm, taps = probe.target, probe.taps


def llama_drafts(seq: list[int], feats: np.ndarray, start: int) -> np.ndarray:
    """[anchors, B-1] token ids drafted by llama.cpp at every anchor start .. len(seq)-2."""
    return np.array([probe.draft_at(seq, feats, p) for p in range(start, len(seq) - 1)])


def torch_drafts(data: FeatureDataset) -> np.ndarray:
    """The same, through the trainer's packing (dataset.anchor_blocks) and the torch drafter."""
    (anchors,) = data.walk_anchors(0)
    out = []
    with torch.no_grad():
        for i in range(0, len(anchors), 48):
            pb = data.anchor_blocks(0, anchors[i:i + 48], B, config.mask_token_id)
            hidden = drafter(embed_t[torch.as_tensor(pb.block_tokens)][None],
                             torch.as_tensor(np.asarray(pb.ctx_feats, np.float32))[None],
                             torch.as_tensor(pb.block_pos)[None], torch.arange(len(pb.ctx_feats))[None],
                             torch.as_tensor(pb.mask)[None])[0]
            rows = torch.as_tensor(pb.slot > 0)
            out.append(vocab[(hidden[rows] @ head_rows.t()).argmax(-1).numpy()].reshape(-1, B - 1))
    return np.concatenate(out)


walks = {"llama.cpp": Walk(), "torch": Walk()}
anchor_runs = {"llama.cpp": [], "torch": []}
agree, total = np.zeros(B - 1), 0
per_prompt = []
with tempfile.TemporaryDirectory() as tmp:
    for n, row in enumerate(prompts):
        prompt = format_prompt(tm, row)[:1024]
        seq, feats = probe.continuation(prompt, a.max_tokens)
        if len(seq) - len(prompt) < 2:
            continue
        folder = Path(tmp) / str(n)
        meta = {"taps": taps, "n_embd": tm.n_embd, "store_features": True, "top_k_probs": 0}
        DatasetWriter(folder, meta).add(seq, [[len(prompt), len(seq)]], row, prompt_index=n, sampled=False,
                                        feats=np.vstack([feats[:-1], np.zeros_like(feats[-1:])]))
        data = FeatureDataset(folder)
        drafts = {"llama.cpp": llama_drafts(seq, feats, len(prompt)), "torch": torch_drafts(data)}
        truth = np.array([[seq[p + k] if p + k < len(seq) else -1 for k in range(1, B)]
                          for p in range(len(prompt), len(seq) - 1)])
        agree += (drafts["llama.cpp"] == drafts["torch"]).sum(axis=0)
        total += len(truth)
        taus = {}
        for name, d in drafts.items():
            runs = leading_correct(d == truth)
            walks[name].add_span(runs, B - 1)
            anchor_runs[name].append(runs)
            one = Walk()
            one.add_span(runs, B - 1)
            taus[name] = round(one.tau, 3)
        per_prompt.append({"id": row.get("id", n), "category": row.get("category"), "anchors": len(truth)} | taus)
        print(json.dumps(per_prompt[-1]), file=sys.stderr)

report = {"drafter": a.drafter.name, "prompts": len(per_prompt), "anchors": total,
          "slot_agreement": [round(float(x / max(total, 1)), 4) for x in agree],
          "walk_tau": {k: round(w.tau, 3) for k, w in walks.items()},
          "anchor_mean_tau": {k: round(1 + float(np.concatenate(v).mean()), 3) for k, v in anchor_runs.items()},
          "walk_slot_accept": {k: [round(x, 3) for x in w.slot_accept] for k, w in walks.items()},
          "per_prompt": per_prompt}
print(json.dumps({k: v for k, v in report.items() if k != "per_prompt"}, indent=2))
if a.json:
    a.json.write_text(json.dumps(report, indent=2))
