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

The prices come from engine/cost.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .confidence import ConfidenceCalibration
from .cost import CostCurve, interp_value, smoothed


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
                ratio[n_drafted] = smoothed(ratio[n_drafted], verify_s / self.cost.t[1], self.cost.smoothing)
                self._observe_lookup_verify(n_drafted + 1, verify_s)
            return
        if draft_s is not None and self.use_confidence:
            self.emptied = self.slots.decay * self.emptied + (1 - self.slots.decay) * (n_drafted == 0)
        if draft_n and draft_s is not None and self.cost is not None:
            self.cost.observe_draft(draft_s, draft_n)
            draft_s = None
        if n_drafted == 0 and verify_s is not None and self.cost is not None:
            # a plain step: only t(1) moves (not through observe_verify: it runs every token of a plain streak)
            self.cost.rescale(smoothed(self.cost.t.get(1), verify_s, self.cost.smoothing))
            return
        if n_drafted > 0:
            self.slots.update(n_drafted, n_accepted)
        if self.cost is not None:
            if verify_s is not None:
                self.cost.observe_verify(n_drafted + 1, verify_s, cold=True)
            if draft_s is not None:
                self.cost.observe_draft(draft_s, n_drafted)
