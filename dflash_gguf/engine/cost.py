"""What the loop's calls cost: seconds per target decode of B rows and per draft call (`CostCurve`), measured
in rounds at calibration (`measure_cost_curve`), kept per model file and machine in the user cache (`CostCache`),
then moved online by every timing the loop takes. The draft-length policy (engine/policy.py) prices its steps
with it, and `bench` reports the curve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np


def interp_value(table: dict[int, float], x: float, monotone: bool = False) -> float:
    """Linear interpolation in a {size: seconds} table (clamped at its ends); with `monotone` the values are first
    made non-decreasing in the size. Plain floats: the loop prices its steps with it after every target decode,
    where each numpy call pays for caches the decode emptied."""
    return _interp_points(_points(table, monotone), x)


def _points(table: dict[int, float], monotone: bool) -> list[tuple[int, float]]:
    """The table's (size, value) pairs in size order, made non-decreasing with `monotone`."""
    out: list[tuple[int, float]] = []
    for k in sorted(table):
        v = table[k] if not out or not monotone else max(out[-1][1], table[k])
        out.append((k, v))
    return out


def _interp_points(points: list[tuple[int, float]], x: float) -> float:
    return _interp_each(points, (x,))[x]


def _interp_each(points: list[tuple[int, float]], xs: Sequence[float]) -> dict[float, float]:
    """Linear interpolation in sorted (size, value) points, clamped at their ends, at each of xs in one walk over
    the points (None where there are none)."""
    out: dict[float, float] = {}
    i, m = 0, len(points)
    for x in sorted(set(xs)):
        while i < m and points[i][0] < x:
            i += 1
        if i == 0 or i == m:
            out[x] = points[min(i, m - 1)][1] if m else None
        else:
            (prev_k, prev_v), (k, v) = points[i - 1], points[i]
            out[x] = prev_v + (v - prev_v) * (x - prev_k) / (k - prev_k)
    return out


# One timing moves an estimate by at most `smoothing` × 25 %. Steps stall now and then (the OS, Python's
# collector: plain steps of 10–29 ms measured among 7.5 ms ones, SmolLM2 on one core); unclipped, one stall
# made t(1) look 35 % dearer, and as t(1) is only measured on plain steps, the policy then drafted through a
# whole generation at slot-1 acceptance 0.22 and lost 8–17 % on it. A real change of speed still comes
# through, at up to 2.3 % per timing.
OUTLIER_CLIP = 1.25


def smoothed(old: float | None, new: float, smoothing: float) -> float:
    if old is None:
        return new
    return (1 - smoothing) * old + smoothing * min(max(new, old / OUTLIER_CLIP), old * OUTLIER_CLIP)


@dataclass
class CostCurve:
    """Seconds per target decode of B rows (t[B]) and per draft call, updated online.

    With `short_blocks` the drafter runs n+1 rows for n drafts instead of its whole trained block, and
    `t_draft_n[n]` is the cost of a draft call of n tokens; otherwise every draft call costs `t_draft`.

    `t` is a verify right after another target decode (plain streaks, lookup drafts); `t_cold` a verify right
    after a draft call, as the speculative loop runs it: on CPUs the drafter evicts the target's weights from the
    caches in between (measured in the loop: t(2) 1.3–1.6 t(1) against 1.08–1.20 back to back,
    docs/fallback-cost.md). Without a `t_cold` (no drafter, or an old curve) drafts are priced with `t`."""
    t: dict[int, float]
    t_draft: float
    smoothing: float = 0.1
    short_blocks: bool = False
    t_draft_n: dict[int, float] = field(default_factory=dict)
    t_cold: dict[int, float] = field(default_factory=dict)
    shape: dict[int, float] = field(init=False, repr=False, compare=False)   # t(B)/t(1) as first measured
    shape_cold: dict[int, float] = field(init=False, repr=False, compare=False)
    _shape_points: dict[bool, list[tuple[int, float]]] = field(init=False, repr=False, compare=False)
    # Counts the timings that moved a price against t(1); `rescale` moves every price alike and leaves it.
    version: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self):
        t1 = self.t.get(1)
        self.shape = {b: v / t1 for b, v in self.t.items()} if t1 else {}
        self.shape_cold = {b: v / t1 for b, v in self.t_cold.items()} if t1 else {}
        # sorted once: every verify off a plain step reads its shape
        self._shape_points = {False: _points(self.shape, False), True: _points(self.shape_cold, False)}

    def draft(self, n: int) -> float:
        """Seconds of a draft call of n tokens."""
        return self.draft_sizes([n])[0]

    def draft_sizes(self, ns: Sequence[int]) -> list[float]:
        """`draft(n)` for each n, the table sorted once."""
        if not (self.short_blocks and self.t_draft_n):
            return [self.t_draft] * len(ns)
        at = _interp_each(_points(self.t_draft_n, False), ns)
        return [at[n] for n in ns]

    def t1(self) -> float:
        """`verify(1)`: t(1) itself where it is timed (batch sizes start at 1, so no smaller size lifts it), without
        sorting the table."""
        t1 = self.t.get(1)
        return t1 if t1 is not None else self.verify(1)

    def verify(self, b: int, cold: bool = False) -> float:
        """t(b) (after a draft call with `cold`), never below t of a smaller batch: more rows never cost less, and a
        noisy point that says so (measured: t(2)/t(1) = 0.94) would make speculation look free."""
        return self.verify_sizes([b], cold)[0]

    def verify_sizes(self, bs: Sequence[int], cold: bool = False) -> list[float]:
        """`verify(b, cold)` for each b, each table sorted and walked once."""
        warm_points = _points(self.t, True)
        if not (cold and self.t_cold):
            warm = _interp_each(warm_points, bs)
            return [warm[b] for b in bs]
        # A row more costs a cold verify at least what it costs a warm one (the caches' refill is paid once per
        # call, not per row). Each cold size is timed only when its draft length runs, so one can be left from a
        # slower spell: at t_cold(2) 1.27 t(1) and t_cold(3) 1.28 (measured in the loop then: 1.16 and 1.34) two
        # drafts looked as cheap as one, and chat drafted two at a slot 1 of 0.35.
        cold_points = _points(self.t_cold, True)
        warm = _interp_each(warm_points, [*bs, *self.t_cold])
        cold_at = _interp_each(cold_points, bs)
        # (k, the most any cold size up to k costs above the warm curve); adding it to the warm price is monotone in
        # the extra, so warm + the largest extra equals the largest of warm + each extra bit for bit
        largest_extra: list[tuple[int, float]] = []
        for k, _ in cold_points:
            extra = self.t_cold[k] - warm[k]
            largest_extra.append((k, extra if not largest_extra else max(largest_extra[-1][1], extra)))
        out = []
        for b in bs:
            price = max(cold_at[b], warm[b])
            below = [extra for k, extra in largest_extra if k < b]
            if below:
                price = max(price, warm[b] + below[-1])
            out.append(price)
        return out

    def verifies(self, bs: np.ndarray, cold: bool = False) -> np.ndarray:
        return np.array(self.verify_sizes([int(b) for b in bs], cold))

    def observe_verify(self, b: int, seconds: float, cold: bool = False) -> None:
        cold = cold and bool(self.t_cold)
        table, shape = (self.t_cold, self._shape_points[True]) if cold else (self.t, self._shape_points[False])
        if b > 1 and shape and 1 in self.t:
            # t(1) is timed on plain steps only, so a speculative streak would keep whatever it last was. The
            # calibrated shape turns this timing into one of t(1), which may only lower it: a t(1) that looks
            # too dear makes drafting look cheap, the one mistake that loses against plain decoding. The other
            # prices move with it (`rescale`): lowered here alone and raised with them by the next plain steps,
            # t(1) would ratchet every other price up against it.
            implied = seconds / _interp_points(shape, b)
            if implied < self.t[1]:
                self.rescale(smoothed(self.t[1], implied, self.smoothing))
        table[b] = smoothed(table.get(b), seconds, self.smoothing)
        self.version += 1

    def rescale(self, t1: float) -> None:
        """Move t(1) to `t1` and every other price by the same factor. The machine's speed moves all of them
        alike (a shared CPU: t(1) 15-35 ms within minutes; a cost curve cached in a slower hour), while each
        price is timed only when its kind of step runs: moved alone, a t(1) that fell from 10.0 to 6.4 ms left a
        draft priced at 1.48 t(1) for a verify of 2 rows and 0.24 t(1) for its draft call (measured: SmolLM2
        Q4_K_M, calibrated at 1.26 and 0.14), so drafting looked like a loss, never ran, and its prices never
        came down."""
        old = self.t.get(1)
        if not old:
            self.t[1] = t1
            self.version += 1
            return
        factor = t1 / old
        for table in (self.t, self.t_cold, self.t_draft_n):
            for b in table:
                table[b] *= factor
        self.t_draft *= factor

    def observe_draft(self, seconds: float, n: int | None = None) -> None:
        if self.short_blocks and n is not None:
            self.t_draft_n[n] = smoothed(self.t_draft_n.get(n), seconds, self.smoothing)
        else:
            self.t_draft = smoothed(self.t_draft, seconds, self.smoothing)
        self.version += 1

    def ratios(self) -> dict[int, float]:
        return {b: self.t[b] / self.t[1] for b in sorted(self.t)}

    def to_json(self) -> dict:
        return {"t": _str_keys(self.t), "t_draft": self.t_draft, "short_blocks": self.short_blocks,
                "t_draft_n": _str_keys(self.t_draft_n), "t_cold": _str_keys(self.t_cold)}

    @classmethod
    def from_json(cls, d: dict) -> "CostCurve":
        return cls(_int_keys(d["t"]), float(d["t_draft"]), short_blocks=bool(d.get("short_blocks", False)),
                   t_draft_n=_int_keys(d.get("t_draft_n", {})), t_cold=_int_keys(d.get("t_cold", {})))


def _str_keys(table: dict[int, float]) -> dict[str, float]:
    return {str(k): v for k, v in table.items()}


def _int_keys(table: dict[str, float]) -> dict[int, float]:
    return {int(k): float(v) for k, v in table.items()}


# A short block (n + 1 rows) drafts a little worse than the trained full block: slot-1 acceptance 0.28 against 0.32
# for an early SmolLM2 drafter, 0.48 against 0.49 for the shipped one (2026-12-03). At a 1-token draft step of
# ~1.35 t(1) yielding ~1.5 tokens, giving up δ = 0.04 of acceptance is paid back once the short block saves
# δ × 1.35 / 1.5 ≈ 0.036 t(1). The rule was a ratio before (short at most 0.7 of a full block): on a Zen 4 EPYC the
# shipped drafter's 2-row block measured 0.71-0.74 of its 8-row one at calibration, so the choice flipped between
# calibrations, and the full block read 1.07x own plain where the short one read 1.14x (always one draft).
SHORT_BLOCK_SAVING = 0.04


def measure_cost_curve(time_verify: Callable[[int], float], time_draft: Callable[[int, bool], float] | None,
                       sizes=(1, 2, 3, 4, 6, 8, 12, 16), repeats: int = 5, draft_ns: Sequence[int] = (1,),
                       draft_max: int = 1, short_saving: float = SHORT_BLOCK_SAVING) -> CostCurve:
    """Median of `repeats` timings per batch size, taken in rounds over all sizes so that a slow spell of a
    shared machine hits every size alike. time_verify(B) runs one target decode of B rows; time_draft(n, short)
    one draft call of n tokens, with n+1 rows (short) or the whole block; both return seconds. Without a
    drafter (time_draft None) only the verify curve is measured.

    Interleaved as the loop runs them: the verify sizes back to back (`t`: what a plain streak or a lookup
    draft pays), then per draft length a target decode, the draft, and the verify of its n+1 rows right after it
    (`t_draft_n`, `t_cold`: each with the other model's weights just through the caches).

    Short blocks are used where a 1-token draft saves at least `short_saving` × t(1) against a full block (CPUs,
    where the drafter's cost grows with its rows); on a GPU, where a few rows cost as much as a block, the
    trained full block drafts better."""
    times: dict[int, list[float]] = {b: [] for b in sizes}
    draft_ns = list(draft_ns) if time_draft is not None else []
    short: dict[int, list[float]] = {n: [] for n in draft_ns}
    cold: dict[int, list[float]] = {n + 1: [] for n in draft_ns}
    full = []
    for r in range(repeats):
        if r and time_draft is not None:
            time_verify(1)          # the last draft's weights out of the caches before the back-to-back sizes
        for b in sizes:
            times[b].append(time_verify(b))
        if time_draft is None:
            continue
        for n in draft_ns:          # the first call of a new shape pays for building its graph (~0.4 ms measured)
            time_draft(n, True)
            time_verify(1)
            short[n].append(time_draft(n, True))
            cold[n + 1].append(time_verify(n + 1))
        time_draft(draft_max, False)
        time_verify(1)
        full.append(time_draft(draft_max, False))
    med = (lambda table: {k: float(np.median(v)) for k, v in table.items()})
    t_full = float(np.median(full)) if full else 0.0
    t_short, t = med(short), med(times)
    use_short = bool(t_short) and t_full - t_short[min(t_short)] >= short_saving * t[min(t)]
    return CostCurve(t, t_full, short_blocks=use_short, t_draft_n=t_short if use_short else {}, t_cold=med(cold))


class CostCache:
    """Cost curves per (model file, machine, backend, threads), in the user cache dir."""

    def __init__(self, path: Path):
        self.path = path

    @staticmethod
    def key(model_path: Path, backend: str, n_threads: int, n_gpu_layers: int, drafter_path: Path | None) -> str:
        """drafter_path None: the verify curve alone (a lookup source, no drafter). The last field is the curve
        format: a new one when what a curve holds or how it is measured changes."""
        import platform  # noqa: PLC0415
        st = model_path.stat()
        drafter = f"{drafter_path.name}:{drafter_path.stat().st_size}" if drafter_path else "no-drafter"
        return (f"{model_path.resolve()}:{st.st_size}:{int(st.st_mtime)}|{drafter}|"
                f"{platform.node()}|{backend}|t{n_threads}|ngl{n_gpu_layers}|v6")

    def get(self, key: str) -> CostCurve | None:
        try:
            return CostCurve.from_json(json.loads(self.path.read_text())[key])
        except (FileNotFoundError, KeyError, ValueError):
            return None

    def put(self, key: str, curve: CostCurve) -> None:
        self._update(lambda data: data.__setitem__(key, curve.to_json()))

    def drop(self, key: str) -> None:
        """Forget the curve of `key`: the next engine with that key measures it again."""
        self._update(lambda data: data.pop(key, None))

    def _update(self, change: Callable[[dict], object]) -> None:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        change(data)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.path)


# How far the t(1) the loop measures may move from a cached curve's before the curve counts as timed in another state
# of the machine. Its scale follows t(1) (CostCurve.rescale), its shape does not: a curve timed while another process
# held one of two cores read 3.15 s a SmolLM2 token (3-8 ms quiet) with verifies of 2 and 33 rows at 1.00 and 0.96 t(1),
# which priced every verify as free (2026-12-06). A shared CPU moves t(1) 2-2.5x within minutes (rescale's docstring).
STALE_CALIBRATION = 4.0


def calibration_is_stale(calibrated_t1: float, live_t1: float) -> bool:
    """Whether a cost curve calibrated at t(1) = calibrated_t1 no longer describes a machine decoding at live_t1."""
    ratio = live_t1 / calibrated_t1
    return not 1 / STALE_CALIBRATION < ratio < STALE_CALIBRATION
