"""How many draft tokens to verify each step.

Verifying B tokens costs t(B), which is far from flat on CPUs (SmolLM2 Q4_1 on 2 cores:
t(16) ≈ 8·t(1); F16: 3.6×) and nearly flat on big GPUs. With α_k the probability that slot k is
accepted given slots < k were, a step that verifies n drafts yields E(n) = 1 + Σ_{j≤n} Π_{k≤j} α_k
tokens in t(n+1) + t_draft. We pick the n with the best E(n) / time, and plain decoding
(1 token in t(1)) when no n beats it — probing speculation now and then so α stays current.

With a lookup source beside the drafter (engine/sources/lookup.py) each step weighs three prices: plain, the
drafter's best n (its verify priced as the loop runs it: right after a draft, which evicted the target's weights
from the caches), and the lookup continuation's best k (no draft call, a verify with warm caches), with the
lookup's acceptance tracked per match length from every step's emitted tokens, verified or not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .confidence import ConfidenceCalibration


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


def _smoothed(old: float | None, new: float, smoothing: float) -> float:
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
                self.rescale(_smoothed(self.t[1], implied, self.smoothing))
        table[b] = _smoothed(table.get(b), seconds, self.smoothing)
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
            self.t_draft_n[n] = _smoothed(self.t_draft_n.get(n), seconds, self.smoothing)
        else:
            self.t_draft = _smoothed(self.t_draft, seconds, self.smoothing)
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


@dataclass
class SlotAcceptance:
    """Online estimate of α_k with a Beta prior; old evidence decays so the estimate follows the text. Plain floats:
    it is read and updated every step, right after a target decode."""
    n_slots: int
    prior_accept: float | Sequence[float] = 0.6      # one value for every slot, or [n_slots]
    prior_weight: float = 4.0
    decay: float = 0.98

    def __post_init__(self):
        p = self.prior_accept
        self.prior = [float(p)] * self.n_slots if np.isscalar(p) else [float(x) for x in p]
        self.tried = [0.0] * self.n_slots          # decayed counts: the verifier reached the slot
        self.accepted = [0.0] * self.n_slots       # the target kept it
        self.updates = 0

    def update(self, n_drafted: int, n_accepted: int) -> None:
        d, tried, accepted = self.decay, self.tried, self.accepted
        reached = min(n_accepted + 1, n_drafted, self.n_slots)
        for i in range(self.n_slots):
            tried[i] = d * tried[i] + (i < reached)
            accepted[i] = d * accepted[i] + (i < n_accepted)
        self.updates += 1

    def alpha(self) -> list[float]:
        w = self.prior_weight
        return [(a + p * w) / (t + w) for a, t, p in zip(self.accepted, self.tried, self.prior)]

    def carried(self, weight: float | None = None) -> "SlotAcceptance":
        """A fresh estimate with this one's α as its prior, at `weight` (default: the prior's weight)."""
        return type(self)(self.n_slots, self.alpha(), self.prior_weight if weight is None else weight,
                              self.decay)

    def draw_first(self, rng: np.random.Generator) -> float:
        """α1 drawn from its Beta posterior: the prior's pseudo-counts plus the decayed counts."""
        hits = self.accepted[0] + self.prior[0] * self.prior_weight
        misses = self.tried[0] + self.prior_weight - hits
        return float(rng.beta(max(hits, 1e-3), max(misses, 1e-3)))


class LookupAcceptance:
    """α of a lookup continuation's slots per match length (1..max_match): the continuation of a long match is
    copied text far more often than that of one token. Fed from every step's emitted tokens, whether the
    continuation was verified or not (the tokens a step emits are the target's own picks for those positions, and
    at T > 0 a point-mass draft x is accepted with probability p(x), the chance the target emits x), so it costs
    no target call to keep current. Plain Python lists: it runs every step."""

    def __init__(self, n_slots: int, max_match: int, prior_accept: float | list = 0.3, prior_weight: float = 2.0,
                 decay: float = 0.98):
        self.n_slots, self.max_match, self.prior_weight, self.decay = n_slots, max_match, prior_weight, decay
        buckets = range(max_match + 1)
        self.prior = prior_accept if isinstance(prior_accept, list) else [[prior_accept] * n_slots for _ in buckets]
        self.tried = [[0.0] * n_slots for _ in buckets]
        self.accepted = [[0.0] * n_slots for _ in buckets]
        self._expected: list[list[float] | None] = [None for _ in buckets]

    def record(self, match_len: int, n_known: int, n_agreed: int) -> None:
        """A continuation after a match of match_len tokens: the target's tokens are known for its first n_known
        slots, and the first n_agreed of them agreed."""
        b = min(match_len, self.max_match)
        tried, accepted, d = self.tried[b], self.accepted[b], self.decay
        for i in range(min(n_known, n_agreed + 1)):     # each slot's evidence decays as new evidence for it comes
            tried[i] = d * tried[i] + 1.0
            accepted[i] = d * accepted[i] + (i < n_agreed)
        self._expected[b] = None

    def alpha(self, match_len: int, up_to: int | None = None) -> list[float]:
        """α of the first `up_to` slots (all by default) after a match of match_len tokens."""
        b = min(match_len, self.max_match)
        w = self.prior_weight
        slots = slice(None) if up_to is None else slice(up_to)
        return [(a + p * w) / (t + w)
                for a, t, p in zip(self.accepted[b][slots], self.tried[b][slots], self.prior[b][slots])]

    def expected(self, match_len: int, up_to: int | None = None) -> list[float]:
        """E(k) for k = 0..n_slots (at least 0..up_to): 1 + Σ_{j≤k} Π_{i≤j} α_i. Only as far as asked: each
        step's record empties its bucket, and a continuation offers fewer slots than a long lookup may take."""
        b = min(match_len, self.max_match)
        need = self.n_slots if up_to is None else min(up_to, self.n_slots)
        e = self._expected[b]
        if e is None or len(e) <= need:
            e, run = [1.0], 1.0
            for a in self.alpha(b, need):
                run *= a
                e.append(e[-1] + run)
            self._expected[b] = e
        return e

    def carried(self) -> "LookupAcceptance":
        """A fresh estimate with this one's α as its prior, at the prior's weight."""
        return LookupAcceptance(self.n_slots, self.max_match, [self.alpha(b) for b in range(self.max_match + 1)],
                                self.prior_weight, self.decay)


PLAIN_STEP = ("plain", 0)


class DraftLengthPolicy:
    """Chooses n (0 = plain decoding step) each step; `fixed` always returns draft_max. With a lookup source,
    `choose_step` also weighs its continuation against the drafter and plain decoding."""

    def __init__(self, draft_max: int, draft_min: int = 1, *, adaptive: bool = True,
                 cost: CostCurve | None = None, probe_every: int = 16, margin: float = 0.03, recheck: int = 1,
                 lookup_max: int | None = None, explore: bool = True, carry_weight: float = 8.0, seed: int = 0):
        """lookup_max: most tokens of a lookup continuation one verify takes (adaptive only; default draft_max):
        a text that repeats itself is worth long verifies where the drafter's block ends long before.

        explore: weigh each step with α1 drawn from its posterior rather than its mean (Thompson sampling). With
        the mean, an estimate that fell below the break-even (a few rejections, or the last generation's text)
        stopped drafting, and with it the only evidence that could raise it: replayed on recorded acceptance,
        the policy then ran plain through answers where slot 1 was accepted 0.6-0.7 of the time, and read
        1.04-1.10x own plain where always drafting one or two tokens read 1.15-1.27x (docs/policy.md). Drawn, a
        drafter near the break-even is tried about as often as it may pay, and one far below it almost never.
        carry_weight: how many observations the α a generation starts from (the last one's) counts for.
        seed: the draws' generator (the policy picks only how many drafts to verify: outputs do not depend on it)."""
        if draft_min < 1 or draft_max < draft_min:
            raise ValueError(f"need 1 <= draft_min ({draft_min}) <= draft_max ({draft_max})")
        self.draft_max, self.draft_min = draft_max, draft_min
        self.lookup_max = lookup_max or draft_max
        self._pending: list[list] = []      # lookup offers still being checked against the text: [match, tokens,
                                            # slots known, slots agreed]
        self.adaptive = adaptive and cost is not None
        self.cost = cost
        self.slots = SlotAcceptance(draft_max)
        self.probe_every, self.margin = probe_every, margin
        self.recheck = max(1, recheck)
        self._plain_streak = 0
        self._probe_gap = probe_every
        self.last_reason = "fixed" if not self.adaptive else "init"
        self.use_confidence = True          # trim blocks by the drafter's confidences, where it gives them
                                            # (the engine asks the drafter for them: DFlash's probabilities with
                                            # --draft-trim, DSpark's confidence head with --draft-confidence)
        self.calibration: ConfidenceCalibration | None = None   # set where the confidences are raw probabilities
        self.emptied = 0.0                  # decayed share of draft calls whose every slot `trim` left unverified
        self.has_drafter = True             # False: a lookup source alone (choose_step never asks the drafter)
        self.lookup: LookupAcceptance | None = None
        self._rates: dict[int, float] = {}  # the drafter's expected tokens/s per n, as last weighed
        self.explore, self.carry_weight = explore, carry_weight
        self._rng = np.random.default_rng(seed)
        self._prices_key: tuple | None = None
        self._cutoff, self._cutoff_key = 0.0, None
        self._prices: tuple[list[float], float] = ([], 1.0)   # per n: seconds / t(1) of a draft step; 1 - q
        self._warm: list[float] | None = None   # t(1..draft_max+1)/t(1) with warm caches (the lookup's verifies)

    def use_lookup(self, max_match: int) -> None:
        self.lookup = LookupAcceptance(self.lookup_max, max_match)

    def reset(self) -> None:
        """A new generation starts from the α the last one ended with (weighted like the prior), not from the
        fixed 0.6: on text where drafts fail, that guess had every generation draft until failures outweighed it
        (~4 steps on SmolLM2's one-thread cost curve). Probing starts over at `probe_every`: the new answer may
        be one where drafting pays though the last was not (starting at half the last gap measured no better:
        docs/fallback-cost.md)."""
        self.slots = self.slots.carried(self.carry_weight)
        if self.lookup is not None:
            self.lookup = self.lookup.carried()
        self._pending = []
        self._plain_streak = 0
        self._probe_gap = self.probe_every

    def expected_rates(self, alpha1: float | None = None) -> dict[int, float]:
        """Expected tokens per second for each n (0 = plain decoding): α1 drawn from its posterior when exploring
        (or `alpha1`, drawn by the caller), the later slots at their means. Also keeps the α1 below which plain
        decoding beats every n by the margin (`_cutoff`): a plain step's weighing is then one draw and a compare.

        Plain floats over at most draft_max slots: this runs every step, right after a target decode, where
        each numpy call pays for cold caches."""
        alpha = self.slots.alpha()
        if alpha1 is None:
            alpha1 = self.slots.draw_first(self._rng) if self.explore else alpha[0]
        prices, kept = self._step_prices()
        t1 = self.cost.t1()
        rates = {0: 1.0 / t1}
        cutoff = float("inf")
        e, run = 1.0, 1.0                  # E(n) = 1 + Σ_{j≤n} Π_{k≤j} α_k
        s_n, later = 0.0, 1.0              # S_n = Σ_{j≤n} Π_{2≤k≤j} α_k: E(n) = 1 + α1 S_n
        for n in range(1, self.draft_max + 1):
            run *= alpha1 if n == 1 else alpha[n - 1]
            e += run
            s_n += later
            if n < len(alpha):
                later *= alpha[n]
            if n >= self.draft_min:
                price = prices[n - self.draft_min]
                # With trimming, α is counted on the drafts that were verified; a call whose every slot was trimmed
                # (share q) yields one token for a plain verify. Left out, a drafter unsure everywhere would be
                # called at every step (its draft paid, nothing verified, α never updated).
                rates[n] = (kept * e + 1.0 - kept) / (price * t1)
                cutoff = min(cutoff, ((1 + self.margin) * price - 1.0) / (kept * s_n))
        self._rates = rates
        self._cutoff, self._cutoff_key = cutoff, self._state_key()
        return rates

    def _state_key(self) -> tuple:
        """What the rates depend on besides α1's draw and t(1)."""
        return id(self.slots), self.slots.updates, id(self.cost), self.cost.version, self.emptied

    def _prices_state(self) -> tuple:
        """What the drafter's step prices depend on: the curve and its timings against t(1), and the share q."""
        return id(self.cost), self.cost.version, self.emptied

    def _step_prices(self) -> tuple[list[float], float]:
        """Seconds of a draft step of each n from draft_min on, in units of t(1) (its draft call, then its verify
        right after it), and 1 - q; kept until a timing moves a price against t(1)."""
        q = self.emptied
        key = self._prices_state()
        if key != self._prices_key:
            cost, t1 = self.cost, self.cost.t1()
            # a drafter's verify runs right after its draft: cold
            ns = list(range(self.draft_min, self.draft_max + 1))
            verifies = cost.verify_sizes([n + 1 for n in ns], cold=True)
            self._prices = ([((1 - q) * v + q * t1 + d) / t1 for v, d in zip(verifies, cost.draft_sizes(ns))],
                            1.0 - q)
            self._prices_key = key
        return self._prices

    def choose(self) -> int:
        if not self.adaptive:
            return self.draft_max
        # Weighed every `recheck` steps of a plain streak (default every step: each weighing draws α1 anew, and
        # the draws are what try a drafter near the break-even). A plain step's weighing is one draw against the
        # cached cutoff (`_weigh`); the prices relative to t(1) are cached between the timings that move them.
        if self._plain_streak % self.recheck == 0:
            best = self._weigh()
            if best:
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

    def _weigh(self) -> int:
        """The n with the best expected rate, or 0 where plain decoding beats it by the margin."""
        alpha1 = None
        if self.explore:
            alpha1 = self.slots.draw_first(self._rng)
            if self._cutoff_key == self._state_key() and alpha1 < self._cutoff:
                self._rates = {}
                return 0
        rates = self.expected_rates(alpha1)
        best = max((n for n in rates if n > 0), key=rates.get)
        return best if rates[best] >= rates[0] * (1 + self.margin) else 0

    def choose_step(self, match_len: int, available: int) -> tuple[str, int]:
        """("plain", 0), ("draft", n): n drafter tokens, or ("lookup", k): the first k of the lookup's
        continuation (`available` tokens after a match of `match_len`). The lookup wins where its expected
        tokens per second, E_m(k) / t(k+1) with warm caches and no draft call, beat both plain decoding (by the
        margin) and the drafter's choice; without a cost curve wherever it has a continuation."""
        n = self.choose() if self.has_drafter else 0
        if not available:
            return ("draft", n) if n else PLAIN_STEP
        if not self.adaptive:
            k_max = min(available, self.draft_max)
            self.last_reason = "lookup"
            return ("lookup", k_max)
        # in units of 1 / t(1): the lookup's verifies are priced by their ratio to a plain step, which holds
        # while the machine's load moves both (a shared CPU: t(1) 15–35 ms within minutes)
        k_max = min(available, self.lookup_max)
        e, ratio = self.lookup.expected(match_len, k_max), self._warm_ratios()
        best_k, best = 0, 1 + self.margin
        if n:
            best = max(best, self._rates.get(n, 0.0) * self.cost.t[1])
        for k in range(1, k_max + 1):
            rate = e[k] / ratio[k]
            if rate > best:
                best_k, best = k, rate
        if best_k:
            self.last_reason = "lookup"
            return ("lookup", best_k)
        return ("draft", n) if n else PLAIN_STEP

    def _warm_ratios(self) -> list[float]:
        """t(k+1)/t(1) with warm caches for k = 0..draft_max: calibrated, then each lookup verify's own ratio to
        the t(1) of its time (smoothed and clipped like every timing)."""
        if self._warm is None:
            shape = self.cost.shape or self.cost.ratios()
            self._warm = [interp_value(shape, b, monotone=True) for b in range(1, self.lookup_max + 2)]
        return self._warm

    def observe_lookup(self, match_len: int, continuation: list[int] | None, emitted: list[int]) -> None:
        """A step's emitted tokens against the lookup continuation offered before it (verified or not; None: none
        was offered). An offer is checked against the text that follows it until a slot disagrees or every slot is
        known, over as many steps as that takes: its slots past what one step emits get evidence too, without
        which a slot beyond the verifies taken so far would keep its prior and never be tried."""
        if continuation:
            self._pending.append([match_len, continuation[:self.lookup_max], 0, 0])
        still = []
        for offer in self._pending:
            match, tokens, known, agreed = offer
            for t in emitted:
                if known == len(tokens):
                    break
                known += 1
                if tokens[known - 1] != t:
                    break
                agreed += 1
            if agreed < known or known == len(tokens):
                self.lookup.record(match, known, agreed)
            else:
                offer[2:] = known, agreed
                still.append(offer)
        self._pending = still

    def _observe_lookup_verify(self, b: int, seconds: float) -> None:
        """A lookup verify of b rows into the warm curve. The drafter's prices (and the cutoff weighed from them)
        read the warm curve up to draft_max + 1 rows, interpolated between timed sizes: a timing past the first
        timed size from there leaves them as they are, so they stay cached. Otherwise every lookup verify would
        weigh them anew (measured: 125 µs a step on a Zen 1, 15,100 of 20,000 steps recomputed, docs/policy.md)."""
        prices_current = self._prices_key == self._prices_state()
        cutoff_current = self._cutoff_key == self._state_key()
        read_up_to = min((k for k in self.cost.t if k >= self.draft_max + 1), default=None)
        self.cost.observe_verify(b, seconds)
        if read_up_to is None or b <= read_up_to:
            return
        if prices_current:
            self._prices_key = self._prices_state()
        if cutoff_current:
            self._cutoff_key = self._state_key()

    def trim(self, confidence: np.ndarray) -> int:
        """How many of a drafted block's slots to verify when the drafter rates each (c_i, the chance slot i is
        accepted once the slots before it were: DSpark's confidence head, or DFlash's top probabilities mapped
        through `calibration`): the k with the best E(k) / (t_draft + t(k+1)), E(k) = 1 + Σ_{j≤k} Π_{i≤j} c_i,
        t(k+1) priced as right after a draft; all of them without a cost curve or with `use_confidence` off.
        Lossless at any k: the choice reads only the drafter."""
        n = len(confidence)
        if not (self.adaptive and self.use_confidence) or n == 0:
            return n
        c = self.calibration(confidence) if self.calibration is not None else np.asarray(confidence, np.float64)
        e = np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(c))])
        t = np.concatenate([[self.cost.verify(1)], self.cost.verifies(np.arange(2, n + 2), cold=True)])
        return int(np.argmax(e / (t + self.cost.draft(n))))

    def observe(self, n_drafted: int, n_accepted: int, verify_s: float | None = None,
                draft_s: float | None = None, draft_n: int | None = None, lookup: bool = False) -> None:
        """n_drafted: drafts verified; draft_n: drafts the draft call made, when `trim` kept fewer; lookup: the
        drafts came from the lookup source (no draft call before the verify; their α is `observe_lookup`'s)."""
        if lookup:
            if self.cost is not None and verify_s is not None:
                ratio = self._warm_ratios()
                ratio[n_drafted] = _smoothed(ratio[n_drafted], verify_s / self.cost.t[1], self.cost.smoothing)
                self._observe_lookup_verify(n_drafted + 1, verify_s)
            return
        if draft_s is not None and self.use_confidence:
            self.emptied = self.slots.decay * self.emptied + (1 - self.slots.decay) * (n_drafted == 0)
        if draft_n and draft_s is not None and self.cost is not None:
            self.cost.observe_draft(draft_s, draft_n)
            draft_s = None
        if n_drafted == 0 and verify_s is not None and self.cost is not None:
            # a plain step: only t(1) moves (not through observe_verify: it runs every token of a plain streak)
            self.cost.rescale(_smoothed(self.cost.t.get(1), verify_s, self.cost.smoothing))
            return
        if n_drafted > 0:
            self.slots.update(n_drafted, n_accepted)
        if self.cost is not None:
            if verify_s is not None:
                self.cost.observe_verify(n_drafted + 1, verify_s, cold=True)
            if draft_s is not None:
                self.cost.observe_draft(draft_s, n_drafted)
