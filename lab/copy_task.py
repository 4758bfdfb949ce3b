#!/usr/bin/env python3
"""Can the drafter learn to copy? A task whose answers repeat the prompt, adapted on, measured on unseen requests.

A desktop app's "code formatter" sends code snippets of the shipped prompt set's trained part (completions of 200 to
1,200 characters, in a fixed shuffled order) as "Format this code: ```python …```" behind one system prompt that asks
for the code back unchanged; SmolLM2 answers by repeating it (greedy), so about a third of the anchors along its
answers are copy anchors (lab/copy_anchors.py), where a copier would accept ~5.5 of 7.
  play     `serve --learn STORE` answers the first --n requests over HTTP (lab/learn_harness.py's play)
  adapt    `train --adapt STORE` from the shipped drafter (--rows, --lr; --force: written whatever the general set
           says, this is a probe)
  measure  copy anchors and the rest of each drafter (-md, repeatable; default the shipped one) along the target's
           greedy answers to --test requests from --first, which the store does not hold
Used in docs/learning.md ("Can it learn to copy at all?").

  .venv/bin/python lab/copy_task.py play --store /tmp/copy/store --n 400
  .venv/bin/python lab/copy_task.py adapt --store /tmp/copy/store -o /tmp/copy/adapted.gguf
  .venv/bin/python lab/copy_task.py measure -md dflash_gguf/assets/smollm2-135m-instruct.dflash-q8_0.gguf \\
      -md /tmp/copy/adapted.gguf
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.assets import shipped_drafter_for  # noqa: E402
from dflash_gguf.corpus.prompts import DEFAULT_PROMPTS, HELD_BACK_FROM, load  # noqa: E402
from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402
from lab import learn_harness  # noqa: E402
from lab.copy_anchors import drafters_anchors  # noqa: E402

SYSTEM = ("You are CopyEdit, a code formatter in an IDE. Reply with the user's code unchanged in one ```python code "
          "block, then one line saying whether it is already well formatted.")


def requests() -> list[dict]:
    """The task's requests as chat rows, in a fixed order (the first ones are played, later ones measured)."""
    trained = load(DEFAULT_PROMPTS)[:HELD_BACK_FROM]
    code = [r for r in trained if r.get("format") == "completion" and 200 <= len(r["prompt"]) <= 1200]
    order = np.random.default_rng(0).permutation(len(code))
    return [{"id": f"copy-task:{i}", "category": "copy-task", "format": "chat",
             "messages": [{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": f"Format this code:\n```python\n{code[j]['prompt'].strip()}\n```"}]}
            for i, j in enumerate(order)]


def measure(drafters: list[Path], rows: list[dict], threads: int) -> None:
    for drafter, kinds in drafters_anchors(drafters, smollm2_q4_1(), learn_harness.rendered(rows), 128, threads):
        total = sum(len(v) for v in kinds.values())
        accepted = [k for pairs in kinds.values() for k, _ in pairs]
        print(f"{drafter.name}: τ {1 + np.mean(accepted):.3f} over {total} anchors")
        for (_, kind), pairs in sorted(kinds.items()):
            got, copier = np.array(pairs).T
            line = f"  {kind:>5}: {len(pairs):5d} anchors ({len(pairs) / total:.0%}), accepted {got.mean():.3f}"
            print(line + (f", a copier {copier.mean():.3f}" if kind == "copy" else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["play", "adapt", "measure"])
    ap.add_argument("--store", type=Path, help="play, adapt: the --learn store")
    ap.add_argument("--n", type=int, default=400, help="play: requests recorded")
    ap.add_argument("-o", "--out", type=Path, help="adapt: the adapted drafter")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--max-minutes", type=float, default=25)
    ap.add_argument("-md", "--drafter", type=Path, action="append", help="measure: repeatable (default: the shipped one)")
    ap.add_argument("--first", type=int, default=2000, help="measure: the first unseen request")
    ap.add_argument("--test", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    target = smollm2_q4_1()
    if a.step == "play":
        settings = argparse.Namespace(conversations=a.n, threads=a.threads, play_tokens=128)
        a.store.mkdir(parents=True, exist_ok=True)
        print(learn_harness.play(requests(), a.store, settings, a.store.parent / "play.log"))
    elif a.step == "adapt":
        subprocess.run(learn_harness.cli("train", "--adapt", a.store, "-m", target, "-md", shipped_drafter_for(target),
                                         "-o", a.out, "--work-dir", a.out.with_suffix(".work"), "--rows", a.rows,
                                         "--lr", a.lr, "--max-minutes", a.max_minutes, "--force", "-t", a.threads),
                       cwd=ROOT, check=True)
    else:
        measure(a.drafter or [shipped_drafter_for(target)], requests()[a.first:a.first + a.test], a.threads)


if __name__ == "__main__":
    main()
