"""Sampling settings and the logits → probabilities transform shared by target (p) and drafter (q).

Speculative sampling is lossless only if p and q go through the very same transform, so there is
exactly one: temperature, then top-k, then top-p, then min-p (llama.cpp's default chain order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Range:
    """The values one sampling setting accepts: lo <= v (lo < v when lo_open), v <= hi (None: no upper bound)."""
    lo: float
    hi: float | None
    meaning: str                 # the value that turns it off, shown with the range
    lo_open: bool = False

    def allows(self, v: float) -> bool:
        above = v > self.lo if self.lo_open else v >= self.lo
        return math.isfinite(v) and above and (self.hi is None or v <= self.hi)

    def describe(self) -> str:
        if self.hi is None:
            return f"must be >= {self.lo:g} ({self.meaning})"
        return f"must be in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}] ({self.meaning})"


# every sampling range, once: `run`'s options, the servers' request fields and the engine check against it
SAMPLING_RANGES = {
    "temperature": Range(0, None, "0 = greedy"),
    "top_k": Range(0, None, "0 = off"),
    "top_p": Range(0, 1, "1 = off; temperature 0 for greedy decoding", lo_open=True),
    "min_p": Range(0, 1, "0 = off"),
}


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0     # 0: greedy
    top_k: int = 0               # 0: off
    top_p: float = 1.0           # 1: off
    min_p: float = 0.0           # 0: off
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def problem(self, names: dict[str, str] | None = None) -> tuple[str, str] | None:
        """The first setting outside SAMPLING_RANGES as (field, one-line message naming it as names[field],
        e.g. a CLI flag, else by its field name); None when all are in range."""
        for field, allowed in SAMPLING_RANGES.items():
            value = getattr(self, field)
            if not allowed.allows(value):
                return field, f"{(names or {}).get(field, field)} {value}: {allowed.describe()}"
        return None

    def validate(self) -> "SamplingParams":
        found = self.problem()
        if found:
            raise ValueError(found[1])
        return self


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Row-wise distribution after the sampling transform (llama.cpp's order: temperature, top-k, top-p, min-p).

    logits: [n, V] (or [V]) float32. Returns float64 probabilities of the same shape, each row
    summing to 1, zero outside the kept set. Greedy gives a one-hot row at the argmax.

    Each row is worked on its candidates only: top-k's, then the fewest largest probabilities top-p needs
    (`_top_p_prefix`), never a sort of the whole vocabulary. A full sort cost ~4 ms a row of 49,152 at
    llama-server's defaults, most of a plain step on a small target and ~10x a verify of 8 rows.
    """
    rows = np.atleast_2d(np.asarray(logits))
    out = np.zeros(rows.shape, dtype=np.float64)    # calloc: only the pages written are touched
    if params.greedy:
        out[np.arange(rows.shape[0]), rows.argmax(axis=1)] = 1.0
        return out.reshape(np.shape(logits))
    for r in range(rows.shape[0]):
        columns, probs = _kept(rows[r], params)
        if columns is None:
            out[r] = probs
        else:
            out[r, columns] = probs
    return out.reshape(np.shape(logits))


def _kept(row: np.ndarray, params: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """(columns, probabilities) of one row of logits after temperature, top-k, top-p and min-p; columns None:
    every column. Top-k is chosen on the row as given: dividing by a temperature keeps its order and its ties
    (distinct float32 values stay distinct in float64), so the same columns are kept."""
    columns = None
    if params.top_k and params.top_k < row.size:
        kth = np.partition(row, -params.top_k)[-params.top_k]
        columns = np.flatnonzero(row >= kth)                 # ties with the k-th value are kept
        row = row[columns]
    x = row.astype(np.float64)
    x /= params.temperature
    x -= x.max()
    p = np.exp(x, out=x)
    p /= p.sum()
    if params.top_p < 1.0:
        # min-p runs after top-p and keeps p >= min_p * max p, the largest entries too: what it would drop
        # top-p need not sort
        keep = _top_p_prefix(p, params.top_p, params.min_p * p.max())
        columns = keep if columns is None else columns[keep]
        p = p[keep]
    if params.min_p > 0.0:
        keep = np.flatnonzero(p >= params.min_p * p.max())
        if keep.size < p.size:
            columns = keep if columns is None else columns[keep]
            p = p[keep]
    return columns, p / p.sum()


def _top_p_prefix(p: np.ndarray, top_p: float, floor: float = 0.0) -> np.ndarray:
    """Ascending indices of the smallest prefix of p sorted by descending probability (ties: lower index first)
    whose mass before each of its entries is below top_p (the entry that crosses it included), cut at entries
    below `floor`. Sorts only the entries at or above the floor, else the m largest and every entry tied with the
    m-th, m growing until the prefix ends inside them: never the whole row for a peaked distribution."""
    m = 64
    while True:
        if floor > 0.0:
            sel = np.flatnonzero(p >= floor)
        elif m >= p.size:
            sel = np.arange(p.size)
        else:
            sel = np.flatnonzero(p >= np.partition(p, p.size - m)[p.size - m])
        order = sel[np.argsort(-p[sel], kind="stable")]
        sorted_p = p[order]
        before = np.cumsum(sorted_p) - sorted_p
        n_kept = int(np.count_nonzero(before < top_p))
        if n_kept < order.size or sel.size == p.size or floor > 0.0:
            return np.sort(order[:n_kept])
        m *= 4


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability row p [V]."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


def draw(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, np.ndarray]:
    """One draw from one row of logits [V] after the transform, with the distribution q [V] it came from."""
    q = probs_from_logits(logits, params)
    return sample(q, rng), q


def pick(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator | None) -> int:
    """The next token from one row of logits [V]: the argmax when greedy, else a draw after the transform.

    The draw runs over the transform's kept columns only, in ascending order: the token `sample` draws from the
    dense row with the same random number (its zeros add nothing to the running sum), without allocating the
    row and summing the whole vocabulary (~0.2 ms a token on SmolLM2's 49,152)."""
    if params.greedy:
        return int(np.argmax(logits))
    columns, probs = _kept(np.asarray(logits), params)
    i = sample(probs, rng)
    return i if columns is None else int(columns[i])
