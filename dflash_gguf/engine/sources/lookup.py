"""Prompt lookup: draft the continuation of the text's last n-gram where it occurred before. No forward pass.

The text is the prompt and everything generated since (the loop hands each step's tokens to `see`). The
longest suffix of 1..max_ngram tokens that occurred earlier wins, its most recent occurrence; the tokens after
that occurrence are the draft. Where the continuation runs into the suffix itself (the text is repeating with
period L − e), it goes on periodically, so a generation caught in a loop drafts whole blocks.

With a corpus (engine/sources/corpus.py: what the target answered in earlier requests), a text whose suffix has
no match of CONTEXT_FIRST tokens in its own request is looked up there. Its matches are reported as match lengths
above max_ngram (max_ngram + m), so the policy keeps their acceptance apart from the request's own matches.

A lookup draft is a point mass: at T > 0 its q is one-hot on the token, so verification accepts it with
probability p(x) and, on rejection, draws from norm(max(p − onehot(x), 0)) — exact in distribution like any q.
"""

from __future__ import annotations

import numpy as np

from .base import DraftSource, Proposal
from .corpus import Corpus

MAX_NGRAM = 6        # longer suffixes add index work per token and rarely change the match on 128-token answers
CONTEXT_FIRST = 2    # a match in the request itself this long is taken over the corpus's


class LookupSource(DraftSource):
    """A draft source over the token text (it reads no features); `see` feeds it the text."""

    member = "lookup"

    def __init__(self, n_vocab: int, block_size: int = 8, max_ngram: int = MAX_NGRAM, corpus: Corpus | None = None):
        self.n_vocab, self.block_size, self.max_ngram, self.corpus = n_vocab, block_size, max_ngram, corpus
        self.text: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}   # n-gram → index right after its latest occurrence that
                                                      # has a next token (n-grams of every length share it)

    @property
    def match_classes(self) -> int:
        """Largest match length `match` reports: the request's own up to max_ngram, the corpus's above it."""
        return self.max_ngram + (self.corpus.max_ngram if self.corpus is not None else 0)

    def begin(self) -> None:
        self.text = []
        self._ends = {}

    def see(self, tokens) -> None:
        """Append tokens to the text (the prompt, then each step's emitted tokens)."""
        text, ends, k = self.text, self._ends, self.max_ngram
        for t in tokens:
            j = len(text)                  # the n-grams ending before j now have a next token: text[j]
            for m in range(1, min(k, j) + 1):
                ends[tuple(text[j - m:j])] = j
            text.append(int(t))

    def match(self, n: int) -> tuple[list[int], int]:
        """(up to n tokens continuing the longest earlier match of the text's suffix, the match's length);
        ([], 0) where no suffix occurred before. Where the request's own match is shorter than CONTEXT_FIRST,
        the corpus's (its length + max_ngram), if it has one."""
        tokens, m = self._own_match(n)
        if self.corpus is not None and m < CONTEXT_FIRST:
            found, cm = self.corpus.match(self.text, n)
            if found:
                return found, self.max_ngram + cm
        return tokens, m

    def _own_match(self, n: int) -> tuple[list[int], int]:
        text, ends = self.text, self._ends
        size = len(text)
        # where a suffix of m tokens occurred, so did its own suffix of m − 1 (ending at the same index): grow m
        # until the first miss (most steps stop after one or two lookups)
        m, e = 0, None
        while m < min(self.max_ngram, size - 1):
            found = ends.get(tuple(text[size - m - 1:]))
            if found is None:
                break
            m, e = m + 1, found
        if e is None:
            return [], 0
        period = size - e
        return [text[e + i] if i < period else text[e + i % period] for i in range(n)], m

    def draft(self, last_token: int, pos: int, n: int, want_logits: bool, pick=None) -> Proposal:
        """The continuation after `last_token` (the text's last token, at pos), at most n tokens; at T > 0
        (want_logits) with q one-hot: the point mass verification must divide by."""
        assert self.text and self.text[-1] == last_token and len(self.text) == pos + 1, "see() the text first"
        tokens, _ = self.match(n)
        return point_mass(tokens, self.n_vocab) if want_logits else Proposal(tokens)


def point_mass(tokens: list[int], n_vocab: int) -> Proposal:
    """A proposal whose every slot was drawn from a point mass on its token: q[i] = onehot(tokens[i])."""
    q = np.zeros((len(tokens), n_vocab))
    q[np.arange(len(tokens)), tokens] = 1.0
    return Proposal(list(tokens), q=q)
