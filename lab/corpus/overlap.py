"""Evaluation hygiene: no training prompt may share a run of words with an evaluation prompt."""

from __future__ import annotations

import json
import re
from pathlib import Path

NGRAM = 8


def _ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


class EvalFilter:
    """Knows the word n-grams of the evaluation prompts; `overlaps(text)` is True if text shares one."""

    def __init__(self, eval_prompts: list[str], n: int = NGRAM):
        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        for p in eval_prompts:
            self.grams |= _ngrams(p, n)

    def overlaps(self, text: str) -> bool:
        return not self.grams.isdisjoint(_ngrams(text, self.n))


def eval_prompts_in(folder: Path) -> list[str]:
    """The prompts of every *.jsonl in `folder` (../shared/prompts); [] when it holds none."""
    return [json.loads(x)["prompt"] for f in sorted(folder.glob("*.jsonl")) for x in f.read_text().splitlines()
            if x.strip()]
