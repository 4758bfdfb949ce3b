"""How many draft tokens to verify each step.

Verifying B tokens costs t(B), which is far from flat on CPUs (SmolLM2 Q4_1 on 2 cores:
t(16) ≈ 8·t(1); F16: 3.6×) and nearly flat on big GPUs. With α_k the probability that slot k is
accepted given slots < k were, a step that verifies n drafts yields E(n) = 1 + Σ_{j≤n} Π_{k≤j} α_k
tokens in t(n+1) + t_draft. We pick the n with the best E(n) / time, and plain decoding
(1 token in t(1)) when no n beats it — probing speculation now and then so α stays current.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .verify import SlotCounts


def interp_table(table: dict[int, float], x, monotone: bool = False):
    """Linear interpolation in a {size: seconds} table (clamped at its ends); with `monotone` the values
    are first made non-decreasing in the size."""
    keys = sorted(table)
    values = [table[k] for k in keys]
    return np.interp(x, keys, np.maximum.accumulate(values) if monotone else values)


# One timing moves an estimate by at most `smoothing` × 25 %. Steps stall now and then (the OS, Python's
# collector: plain steps of 10–29 ms measured among 7.5 ms ones, SmolLM2 on one core); unclipped, one stall
# made t(1) look 35 % dearer, and as t(1) is only measured on plain steps, the policy then drafted through a
# whole generation at slot-1 acceptance 0.22 and lost 8–17 % on it. A real change of speed still comes
# through, at up to 2.3 % per timing.
OUTLIER_CLIP = 1.25


def _smoothed(old: float | None, new: float, smoothing: float) -> float:
    if old is None:
        return new
    return (1 - smoothing) * old + smoothing * min(max(new, old / OUTLIER_CLIP), old * OUTLIER_CLIP)


@dataclass
class CostCurve:
    """Seconds per target decode of B rows (t[B]) and per draft call, updated online.

    With `short_blocks` the drafter runs n+1 rows for n drafts instead of its whole trained block, and
    `t_draft_n[n]` is the cost of a draft call of n tokens; otherwise every draft call costs `t_draft`."""
    t: dict[int, float]
    t_draft: float
    smoothing: float = 0.1
    short_blocks: bool = False
    t_draft_n: dict[int, float] = field(default_factory=dict)
    shape: dict[int, float] = field(init=False, repr=False, compare=False)   # t(B)/t(1) as first measured

    def __post_init__(self):
        self.shape = {b: v / self.t[1] for b, v in self.t.items()} if self.t.get(1) else {}

    def draft(self, n: int) -> float:
        return float(self.drafts(np.array([n]))[0])

    def drafts(self, ns: np.ndarray) -> np.ndarray:
        """Seconds of draft calls of ns tokens."""
        if not (self.short_blocks and self.t_draft_n):
            return np.full(len(ns), self.t_draft)
        return interp_table(self.t_draft_n, ns)

    def verify(self, b: int) -> float:
        return float(self.verifies(np.array([b]))[0])

    def verifies(self, bs: np.ndarray) -> np.ndarray:
        """t(b) for each b, never below t of a smaller batch: more rows never cost less, and a noisy point
        that says so (measured: t(2)/t(1) = 0.94) would make speculation look free."""
        return interp_table(self.t, bs, monotone=True)

    def observe_verify(self, b: int, seconds: float) -> None:
        self.t[b] = _smoothed(self.t.get(b), seconds, self.smoothing)
        if b > 1 and self.shape and 1 in self.t:
            # t(1) is timed on plain steps only, so a speculative streak would keep whatever it last was. The
            # calibrated shape turns this timing into one of t(1), which may only lower it: a t(1) that looks
            # too dear makes drafting look cheap, the one mistake that loses against plain decoding.
            implied = seconds / float(interp_table(self.shape, b))
            if implied < self.t[1]:
                self.t[1] = _smoothed(self.t[1], implied, self.smoothing)

    def observe_draft(self, seconds: float, n: int | None = None) -> None:
        if self.short_blocks and n is not None:
            self.t_draft_n[n] = _smoothed(self.t_draft_n.get(n), seconds, self.smoothing)
        else:
            self.t_draft = _smoothed(self.t_draft, seconds, self.smoothing)

    def ratios(self) -> dict[int, float]:
        return {b: self.t[b] / self.t[1] for b in sorted(self.t)}

    def to_json(self) -> dict:
        return {"t": {str(k): v for k, v in self.t.items()}, "t_draft": self.t_draft,
                "short_blocks": self.short_blocks, "t_draft_n": {str(k): v for k, v in self.t_draft_n.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "CostCurve":
        return cls({int(k): float(v) for k, v in d["t"].items()}, float(d["t_draft"]),
                   short_blocks=bool(d.get("short_blocks", False)),
                   t_draft_n={int(k): float(v) for k, v in d.get("t_draft_n", {}).items()})


def measure_cost_curve(time_verify: Callable[[int], float], time_draft: Callable[[int, bool], float],
                       sizes=(1, 2, 3, 4, 6, 8, 12, 16), repeats: int = 5, draft_ns: Sequence[int] = (1,),
                       draft_max: int = 1, short_gain: float = 0.7) -> CostCurve:
    """Median of `repeats` timings per batch size, taken in rounds over all sizes so that a slow spell of a
    shared machine hits every size alike. time_verify(B) runs one target decode of B rows; time_draft(n, short)
    one draft call of n tokens, with n+1 rows (short) or the whole block; both return seconds.

    Short blocks are used where they cost at most `short_gain` of a full block (CPUs, where the drafter's
    cost grows with its rows); on a GPU, where a few rows cost as much as a block, the trained full block
    drafts better (SmolLM2's drafter: slot-1 acceptance 0.28 with 2 rows, 0.32 with 8)."""
    times: dict[int, list[float]] = {b: [] for b in sizes}
    short: dict[int, list[float]] = {n: [] for n in draft_ns}
    full = []
    for _ in range(repeats):
        for b in sizes:
            times[b].append(time_verify(b))
        for n in draft_ns:          # the second of two calls: a drafter keeps n for a while, and the first
            time_draft(n, True)     # call of a new shape pays for building its graph (~0.4 ms measured)
            short[n].append(time_draft(n, True))
        time_draft(draft_max, False)
        full.append(time_draft(draft_max, False))
    t_full = float(np.median(full))
    t_short = {n: float(np.median(v)) for n, v in short.items()}
    use_short = bool(t_short) and t_short[min(t_short)] <= short_gain * t_full
    return CostCurve({b: float(np.median(v)) for b, v in times.items()}, t_full, short_blocks=use_short,
                     t_draft_n=t_short if use_short else {})


class CostCache:
    """Cost curves per (model file, machine, backend, threads), in the user cache dir."""

    def __init__(self, path: Path):
        self.path = path

    @staticmethod
    def key(model_path: Path, backend: str, n_threads: int, n_gpu_layers: int, drafter_path: Path) -> str:
        import platform  # noqa: PLC0415
        st, dst = model_path.stat(), drafter_path.stat()
        return (f"{model_path.resolve()}:{st.st_size}:{int(st.st_mtime)}|{drafter_path.name}:{dst.st_size}|"
                f"{platform.node()}|{backend}|t{n_threads}|ngl{n_gpu_layers}|v3")   # v3: per-n draft costs, warm timings

    def get(self, key: str) -> CostCurve | None:
        try:
            return CostCurve.from_json(json.loads(self.path.read_text())[key])
        except (FileNotFoundError, KeyError, ValueError):
            return None

    def put(self, key: str, curve: CostCurve) -> None:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        data[key] = curve.to_json()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.path)


@dataclass
class SlotAcceptance:
    """Online estimate of α_k with a Beta prior; old evidence decays so the estimate follows the text."""
    n_slots: int
    prior_accept: float | np.ndarray = 0.6      # one value for every slot, or [n_slots]
    prior_weight: float = 4.0
    decay: float = 0.98
    counts: SlotCounts = field(init=False)

    def __post_init__(self):
        self.counts = SlotCounts.zeros(self.n_slots)

    def update(self, n_drafted: int, n_accepted: int) -> None:
        self.counts.scale(self.decay)
        self.counts.record(n_drafted, n_accepted)

    def alpha(self) -> np.ndarray:
        c = self.counts
        return (c.accepted + self.prior_accept * self.prior_weight) / (c.tried + self.prior_weight)

    def carried(self) -> "SlotAcceptance":
        """A fresh estimate with this one's α as its prior, at the prior's weight."""
        return SlotAcceptance(self.n_slots, self.alpha(), self.prior_weight, self.decay)

    def expected_tokens(self) -> np.ndarray:
        """E(n) for n = 0..n_slots: 1 + Σ_{j≤n} Π_{k≤j} α_k."""
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(self.alpha()))])


class DraftLengthPolicy:
    """Chooses n (0 = plain decoding step) each step; `fixed` always returns draft_max."""

    def __init__(self, draft_max: int, draft_min: int = 1, *, adaptive: bool = True,
                 cost: CostCurve | None = None, probe_every: int = 16, margin: float = 0.03, recheck: int = 32):
        if draft_min < 1 or draft_max < draft_min:
            raise ValueError(f"need 1 <= draft_min ({draft_min}) <= draft_max ({draft_max})")
        self.draft_max, self.draft_min = draft_max, draft_min
        self.adaptive = adaptive and cost is not None
        self.cost = cost
        self.slots = SlotAcceptance(draft_max)
        self.probe_every, self.margin = probe_every, margin
        self.recheck = max(1, recheck)
        self._plain_streak = 0
        self._probe_gap = probe_every
        self.last_reason = "fixed" if not self.adaptive else "init"
        self.use_confidence = True          # trim blocks by the drafter's confidences, where it gives them
                                            # (the engine asks the drafter for them with --draft-confidence)

    def reset(self) -> None:
        """A new generation starts from the α the last one ended with (weighted like the prior), not from the
        fixed 0.6: on text where drafts fail, that guess had every generation draft until failures outweighed it
        (~4 steps on SmolLM2's one-thread cost curve). Probing starts over at `probe_every`: the new answer may
        be one where drafting pays though the last was not (starting at half the last gap measured no better:
        docs/fallback-cost.md)."""
        self.slots = self.slots.carried()
        self._plain_streak = 0
        self._probe_gap = self.probe_every

    def expected_rates(self) -> dict[int, float]:
        """Expected tokens per second for each n (0 = plain decoding)."""
        e = self.slots.expected_tokens()
        ns = np.arange(self.draft_min, self.draft_max + 1)
        t = self.cost.verifies(np.concatenate([[1], ns + 1]))          # one pass per step: this runs every token
        rates = {0: 1.0 / float(t[0])}
        rates.update(zip(ns.tolist(), (e[ns] / (t[1:] + self.cost.drafts(ns))).tolist()))
        return rates

    def choose(self) -> int:
        if not self.adaptive:
            return self.draft_max
        # In a plain streak only t(1) moves (α and the draft costs change when a draft is verified, which
        # ends the streak), so the rates are weighed after every draft and then every `recheck` plain steps:
        # right after a target decode the evaluation costs ~160 us (measured, cold caches), 3 % of a plain step.
        if self._plain_streak % self.recheck == 0:
            rates = self.expected_rates()
            best = max((n for n in rates if n > 0), key=rates.get)
            if rates[best] >= rates[0] * (1 + self.margin):
                self._plain_streak = 0
                self._probe_gap = self.probe_every
                self.last_reason = "speculate"
                return best
        self._plain_streak += 1
        if self._plain_streak >= self._probe_gap:
            # keep α fresh while running plain, at the least cost: the shortest draft (slot 1 gates every
            # longer one), and ever rarer while probes keep confirming plain decoding (16, 32, … 256 steps)
            self._plain_streak = 0
            self._probe_gap = min(2 * self._probe_gap, 16 * self.probe_every)
            self.last_reason = "probe"
            return self.draft_min
        self.last_reason = "plain: speculation would lose"
        return 0

    def trim(self, confidence: np.ndarray) -> int:
        """How many of a drafted block's slots to verify when the drafter rates each (DSpark's confidence head:
        c_i, the chance slot i is accepted once the slots before it were): the k with the best
        E(k) / (t_draft + t(k+1)), E(k) = 1 + Σ_{j≤k} Π_{i≤j} c_i; all of them without a cost curve or with
        `use_confidence` off. Lossless at any k: the choice reads only the drafter."""
        n = len(confidence)
        if not (self.adaptive and self.use_confidence) or n == 0:
            return n
        e = np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(np.asarray(confidence, np.float64)))])
        t = self.cost.verifies(np.arange(1, n + 2)) + self.cost.draft(n)
        return int(np.argmax(e / t))

    def observe(self, n_drafted: int, n_accepted: int, verify_s: float | None = None,
                draft_s: float | None = None, draft_n: int | None = None) -> None:
        """n_drafted: drafts verified; draft_n: drafts the draft call made, when `trim` kept fewer."""
        if draft_n and draft_s is not None and self.cost is not None:
            self.cost.observe_draft(draft_s, draft_n)
            draft_s = None
        if n_drafted == 0 and verify_s is not None and self.cost is not None:
            # a plain step: only t(1) moves (not through observe_verify: it runs every token of a plain streak)
            self.cost.t[1] = _smoothed(self.cost.t.get(1), verify_s, self.cost.smoothing)
            return
        if n_drafted > 0:
            self.slots.update(n_drafted, n_accepted)
        if self.cost is not None:
            if verify_s is not None:
                self.cost.observe_verify(n_drafted + 1, verify_s)
            if draft_s is not None:
                self.cost.observe_draft(draft_s, n_drafted)
