"""Where a drafter's blocks fail: anchors where the target's answer copies its prompt, against the rest.

Walks the target's greedy continuation of each prompt as `bench --tau` does (full blocks, greedy, the next anchor
after the accepted drafts and the target's token) and splits the anchors: a *copy anchor* is one where the 3 tokens
ending at it occur in the prompt and the prompt goes on there with the token the target wrote next. Per category and
kind it prints the anchors, the drafts accepted on average, and what a perfect copier would accept there (the
longest such match, up to the block's drafts). Used in docs/learning.md ("Where the drafter loses on a persona's
unseen prompts: copying").

  .venv/bin/python lab/copy_anchors.py --domain python-reviewer                  # the harness's 50 unseen prompts
  .venv/bin/python lab/copy_anchors.py --shared 20 -md a.gguf -md b.gguf         # ../shared/prompts, 20 per category
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_gguf.assets import shipped_drafter_for  # noqa: E402
from dflash_gguf.bench.tau import NativeDraftProbe, continuations, walk_blocks  # noqa: E402
from dflash_gguf.packaged_models import smollm2_q4_1  # noqa: E402
from lab.learn_harness import SHARED, domain_rows, rendered  # noqa: E402

GRAM = 3          # tokens ending at the anchor that must occur in the prompt


def gram_starts(prompt: list[int]) -> dict:
    """{GRAM tokens of the prompt: [the positions right after each place they occur]}, what copy_match looks up."""
    starts: dict = {}
    for i in range(len(prompt) - GRAM):
        starts.setdefault(tuple(prompt[i:i + GRAM]), []).append(i + GRAM)
    return starts


def copy_match(prompt: list[int], starts: dict, seq: list[int], p: int, n: int) -> int:
    """Tokens after anchor p that a copy of the prompt would get right: the longest run, from any place where the
    prompt holds seq[p-2..p], that goes on as seq does (0: not a copy anchor)."""
    best = 0
    for j in starts.get(tuple(seq[p - GRAM + 1:p + 1]), ()):
        m = 0
        while m < n and j + m < len(prompt) and prompt[j + m] == seq[p + 1 + m]:
            m += 1
        best = max(best, m)
    return best


def split_anchors(probe: NativeDraftProbe, conts) -> dict:
    """{(category, 'copy' | 'other'): [(accepted, copier's), ...]} over every anchor of the walks."""
    out: dict = {}
    for c in conts:
        prompt = c.seq[:c.n_prompt]
        starts = gram_starts(prompt)
        for p, n, k in walk_blocks(probe, c):
            copier = copy_match(prompt, starts, c.seq, p, n)
            kind = (c.row.get("category", "chat"), "copy" if copier else "other")
            out.setdefault(kind, []).append((k, copier))
    return out


def drafters_anchors(drafters: list[Path], target: Path, rows: list[dict], max_tokens: int, threads: int):
    """(drafter, split_anchors) for each drafter along the same greedy continuations of `rows`, generated once for
    every drafter of the same taps."""
    conts, taps = None, None
    for drafter in drafters:
        probe = NativeDraftProbe(target, drafter, threads)
        try:
            if conts is None:
                conts, taps = continuations(probe, rows, max_tokens), probe.taps
            elif probe.taps != taps:
                raise SystemExit(f"{drafter}: taps {probe.taps}, not the first drafter's {taps}; run it on its own")
            kinds = split_anchors(probe, conts)
        finally:
            probe.close()
        yield drafter, kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-md", "--drafter", type=Path, action="append", help="repeatable (default: the shipped one)")
    ap.add_argument("--domain", default="python-reviewer", help="lab/learn_harness.py's domain or persona")
    ap.add_argument("--first", type=int, default=300, help="its first unseen prompt (the harness records before it)")
    ap.add_argument("--test", type=int, default=50, help="its unseen prompts walked")
    ap.add_argument("--shared", type=int, help="walk ../shared/prompts instead, this many per category")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    target = smollm2_q4_1()
    if a.shared:
        from dflash_gguf.bench.prompts import read_rows
        rows = read_rows(sorted(SHARED.glob("*.jsonl")), a.shared)
    else:
        rows = rendered(domain_rows(a.domain)[a.first:a.first + a.test])
    for drafter, kinds in drafters_anchors(a.drafter or [shipped_drafter_for(target)], target, rows, a.max_tokens,
                                           a.threads):
        total = sum(len(v) for v in kinds.values())
        print(drafter.name)
        for (category, kind), pairs in sorted(kinds.items()):
            got, copier = np.array(pairs).T
            line = f"  {category:>10} {kind:>5}: {len(pairs):5d} anchors ({len(pairs) / total:.0%}), accepted {got.mean():.3f}"
            print(line + (f", a copier {copier.mean():.3f}" if kind == "copy" else ""))


if __name__ == "__main__":
    main()
