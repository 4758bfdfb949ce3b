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
    """Row-wise distribution after the sampling transform.

    logits: [n, V] (or [V]) float32. Returns float64 probabilities of the same shape, each row
    summing to 1, zero outside the kept set. Greedy gives a one-hot row at the argmax.
    """
    x = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    if params.greedy:
        out = np.zeros_like(x)
        out[np.arange(x.shape[0]), x.argmax(axis=1)] = 1.0
        return out.reshape(np.shape(logits))
    x = x / params.temperature
    keep = np.ones(x.shape, dtype=bool)
    if params.top_k and params.top_k < x.shape[1]:
        kth = np.partition(x, -params.top_k, axis=1)[:, -params.top_k][:, None]
        keep &= x >= kth
    x = np.where(keep, x, -np.inf)
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    if params.top_p < 1.0:
        order = np.argsort(-p, axis=1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=1)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
        before = np.cumsum(sorted_p, axis=1) - sorted_p
        keep_sorted = before < params.top_p
        mask = np.zeros_like(keep_sorted)
        np.put_along_axis(mask, order, keep_sorted, axis=1)
        p = np.where(mask, p, 0.0)
    if params.min_p > 0.0:
        p = np.where(p >= params.min_p * p.max(axis=1, keepdims=True), p, 0.0)
    p /= p.sum(axis=1, keepdims=True)
    return p.reshape(np.shape(logits))


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability row p [V]."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


def draw(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, np.ndarray]:
    """One draw from one row of logits [V] after the transform, with the distribution q [V] it came from."""
    q = probs_from_logits(logits, params)
    return sample(q, rng), q


def pick(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator | None) -> int:
    """The next token from one row of logits [V]: the argmax when greedy, else a draw after the transform."""
    if params.greedy:
        return int(np.argmax(logits))
    return sample(probs_from_logits(logits, params), rng)
