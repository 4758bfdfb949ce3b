"""What the target answered before, as lookup drafts: an n-gram index over earlier answers (token ids).

A person's traffic repeats itself across requests (the same answer format, the same commands, the same
boilerplate), where prompt lookup sees only the request at hand. The index maps each n-gram of MIN_NGRAM..
MAX_NGRAM tokens of the answers it holds to the place right after its latest occurrence; `match` finds the longest
suffix of the text that occurred there and returns what followed it. The lookup source asks it only where the
request's own text has no match of 2 tokens (engine/sources/lookup.py); like any lookup draft, what it proposes is
verified by the target, so output does not depend on it.

Capped in tokens: past `max_tokens` the oldest answers are dropped and the index rebuilt (each n-gram then points
into the answers kept). The index is keyed by the n-grams' hashes (~40 MB at the default cap where every n-gram
differs, ~10 MB less than the tuples themselves); two n-grams sharing a hash only cost a draft the target rejects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MIN_NGRAM = 3            # 2, 3 and 4 measured alike on two personas (docs/learning.md)
MAX_NGRAM = 6
DEFAULT_MAX_TOKENS = 65_536   # ~500 answers of 128 tokens; the index holds 4 entries per token


class Corpus:
    """An n-gram index over answers, oldest first; `add` appends one."""

    max_ngram = MAX_NGRAM

    def __init__(self, answers: Iterable[Sequence[int]] = (), max_tokens: int = DEFAULT_MAX_TOKENS):
        if max_tokens < 1:
            raise ValueError(f"max_tokens {max_tokens}: must be >= 1")
        self.max_tokens = max_tokens
        self.answers: list[list[int]] = []
        self.n_tokens = 0
        self._first = 0                                  # number of the oldest answer kept
        self._ends: dict[int, int] = {}   # hash of an n-gram → answer number << 32 | the index after it
        for a in answers:
            self.add(a, _index=False)
        self._rebuild()

    def __len__(self) -> int:
        return len(self.answers)

    def add(self, answer: Sequence[int], *, _index: bool = True) -> None:
        """Index one more answer (the newest); drops the oldest ones past the cap."""
        tokens = [int(t) for t in answer]
        if len(tokens) <= MIN_NGRAM:
            return                       # no n-gram of it has a next token
        self.answers.append(tokens)
        self.n_tokens += len(tokens)
        if self.n_tokens > self.max_tokens:
            self._evict()
        elif _index:
            self._index(len(self.answers) - 1)

    def match(self, text: Sequence[int], n: int) -> tuple[list[int], int]:
        """(up to n tokens that followed the longest suffix of `text` found in the answers, that suffix's length);
        ([], 0) where no suffix of MIN_NGRAM tokens or more occurred."""
        if n < 1:
            return [], 0
        for m in range(min(MAX_NGRAM, len(text)), MIN_NGRAM - 1, -1):
            found = self._ends.get(hash(tuple(text[len(text) - m:])))
            if found is not None:
                return self.answers[(found >> 32) - self._first][found & 0xFFFFFFFF:(found & 0xFFFFFFFF) + n], m
        return [], 0

    def _evict(self) -> None:
        keep = self.max_tokens * 3 // 4          # room for new answers before the next rebuild
        drop = 0
        while self.n_tokens > keep and drop < len(self.answers) - 1:
            self.n_tokens -= len(self.answers[drop])
            drop += 1
        del self.answers[:drop]
        self._first += drop
        self._rebuild()

    def _rebuild(self) -> None:
        self._ends = {}
        for i in range(len(self.answers)):
            self._index(i)

    def _index(self, i: int) -> None:
        tokens, ends, number = self.answers[i], self._ends, (self._first + i) << 32
        for j in range(MIN_NGRAM, len(tokens)):        # n-grams ending before j: their next token is tokens[j]
            for m in range(MIN_NGRAM, min(MAX_NGRAM, j) + 1):
                ends[hash(tuple(tokens[j - m:j]))] = number | j
