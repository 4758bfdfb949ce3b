"""The draft → verify → accept → rollback → inject loop.

Invariant after every step: the target and the drafter hold the same positions 0..n_past-1
(the drafter as injected context features), and `last` — the newest emitted token — sits at
position n_past, not yet decoded by either. A lookup source (engine/sources/lookup.py) holds the text
0..n_past: the prompt and every emitted token, `last` included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .policy import PLAIN_STEP, DraftLengthPolicy
from .sampling import SamplingParams, draw, pick, probs_from_logits, sample
from .sources.base import DraftSource, Proposal
from .sources.lookup import LookupSource, point_mass
from .target import Target, check_prompt_fits
from .verify import SlotCounts, Verdict, verify_greedy, verify_stochastic

# Receives each step's new tokens; returning False stops the generation (stop string, disconnect).
TokenCallback = Callable[[list[int]], "bool | None"]


@dataclass
class Timings:
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    inject_s: float = 0.0
    total_s: float = 0.0

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_s

    @property
    def python_s(self) -> float:
        """Time of the decode phase spent outside native calls (sampling, bookkeeping, callbacks)."""
        return max(self.decode_s - self.draft_s - self.verify_s - self.inject_s, 0.0)


@dataclass
class GenerationResult:
    tokens: list[int]
    n_prompt: int
    n_cached: int = 0                      # prompt tokens taken from the caches (not prefilled again)
    finish_reason: str = "length"          # "stop" (EOG / stop string / callback) or "length"
    n_target_calls: int = 0                # target decodes after prefill (verify or plain steps)
    n_plain_steps: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_trimmed: int = 0                     # drafts left unverified because the drafter's confidence said so
    n_lookup_steps: int = 0                # verifies of lookup continuations alone
    n_lookup_drafted: int = 0              # drafts from the lookup (alone or in the drafter's block), in n_drafted
    n_lookup_accepted: int = 0
    n_corpus_accepted: int = 0             # of those, drafted from earlier answers (engine/sources/corpus.py)
    slots: SlotCounts = field(default_factory=SlotCounts)
    timings: Timings = field(default_factory=Timings)

    @property
    def tau(self) -> float:
        """Tokens per target call after the first token (accepted + 1 per verify)."""
        return (len(self.tokens) - 1) / self.n_target_calls if self.n_target_calls else 0.0

    @property
    def drafted_per_slot(self) -> list[int]:
        return [int(x) for x in self.slots.drafted]

    @property
    def accepted_per_slot(self) -> list[int]:
        return [int(x) for x in self.slots.accepted]

    @property
    def acceptance_per_slot(self) -> list[float]:
        return self.slots.per_drafted()

    @property
    def tok_s(self) -> float:
        """Decode speed: tokens after the first over the decode time (prefill excluded)."""
        dt = self.timings.decode_s
        return (len(self.tokens) - 1) / dt if dt > 0 else 0.0

    def python_ms_per_step(self) -> float:
        return 1000 * self.timings.python_s / self.n_target_calls if self.n_target_calls else 0.0

    def stats(self) -> dict:
        t = self.timings
        return {"tau": round(self.tau, 4), "n_target_calls": self.n_target_calls, "n_plain_steps": self.n_plain_steps,
                "n_drafted": self.n_drafted, "n_accepted": self.n_accepted, "n_lookup_steps": self.n_lookup_steps,
                "n_lookup_drafted": self.n_lookup_drafted, "n_lookup_accepted": self.n_lookup_accepted,
                "n_corpus_accepted": self.n_corpus_accepted,
                "acceptance_per_slot": [round(x, 4) for x in self.acceptance_per_slot],
                "tok_s": round(self.tok_s, 2), "n_prompt": self.n_prompt, "n_generated": len(self.tokens),
                "finish_reason": self.finish_reason,
                "prefill_s": round(t.prefill_s, 4), "decode_s": round(t.decode_s, 4), "draft_s": round(t.draft_s, 4),
                "verify_s": round(t.verify_s, 4), "inject_s": round(t.inject_s, 4),
                "python_ms_per_step": round(self.python_ms_per_step(), 4)}


class SpecDecoder:
    """Lossless speculative decoding of one sequence with a target and draft sources: a drafter, a lookup
    source, or both (each step the policy picks plain, the drafter or the lookup continuation).

    t_mode (T > 0 only): "rejection" samples drafts from q and accepts with min(1, p/q);
    "match" proposes the drafter's argmax (q one-hot) — also lossless, accepts with p(x). A lookup draft is a
    point mass in both: q one-hot on its token. (EngineSettings.validate refuses any other t_mode.)
    combine (drafter and lookup): "prefer" verifies the lookup continuation alone where the policy picks it;
    "override" also puts the continuation into the drafter's block where the policy picks the drafter.
    """

    def __init__(self, target: Target, drafter: DraftSource | None, policy: DraftLengthPolicy,
                 *, t_mode: str = "rejection", lookup: LookupSource | None = None, combine: str = "prefer"):
        if combine not in ("prefer", "override"):
            raise ValueError(f"combine must be 'prefer' or 'override', got {combine!r}")
        self.target, self.drafter, self.policy, self.t_mode = target, drafter, policy, t_mode
        self.lookup, self.combine = lookup, combine
        if lookup is not None:
            policy.has_drafter = drafter is not None
            if policy.lookup is None:
                policy.use_lookup(lookup.match_classes)
        self.debug_check_positions = False

    # -- the loop ------------------------------------------------------------------------------
    def generate(self, prompt: Sequence[int], max_tokens: int, sampling: SamplingParams = SamplingParams(),
                 on_tokens: TokenCallback | None = None, stop_tokens: Callable[[int], bool] | None = None,
                 *, n_cached: int = 0) -> GenerationResult:
        """n_cached: the target and the drafter already hold prompt[:n_cached] (engine/prefix.py put
        them there); only the rest is prefilled. 0: both start empty."""
        if not prompt:
            raise ValueError("empty prompt: at least one token (e.g. BOS) is needed")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0 <= n_cached < len(prompt) or (n_cached and n_cached != self.target.n_past):
            raise ValueError(f"n_cached {n_cached}: the caches hold {self.target.n_past} positions and at least "
                             f"one of the {len(prompt)} prompt tokens must be decoded")
        sampling.validate()
        is_stop = stop_tokens or self.target.model.is_eog
        rng = np.random.default_rng(sampling.seed)
        res = GenerationResult([], len(prompt), n_cached=n_cached, slots=SlotCounts.zeros(self.policy.draft_max))
        t_start = time.perf_counter()
        check_prompt_fits(len(prompt), self.target.n_ctx, max_tokens)
        self.policy.reset()
        if not n_cached:
            self.target.reset()
            if self.drafter is not None:
                self.drafter.begin()

        sink = self.drafter.process if self.drafter is not None else None
        last = pick(self.target.prefill(prompt[n_cached:], sink), sampling, rng)
        res.timings.prefill_s = time.perf_counter() - t_start
        if self.lookup is not None:
            self.lookup.begin()
            self.lookup.see(prompt)
            self._offered = None

        emitted = [last]
        while True:
            if self._emit(res, emitted, max_tokens, is_stop, on_tokens):
                break
            room = min(max_tokens - len(res.tokens), self.target.n_ctx - self.target.n_past) - 1
            if room < 0:
                break
            if self.lookup is None:
                n = min(self.policy.choose() if self.drafter is not None else 0, room)
                emitted = self._step(last, n, sampling, rng, res) if n > 0 else self._plain_step(last, sampling, rng, res)
            else:
                self._lookup_seen(emitted)
                emitted = self._choose_and_step(last, room, sampling, rng, res)
            last = emitted[-1]
        res.timings.total_s = time.perf_counter() - t_start
        return res

    def _lookup_seen(self, emitted: list[int]) -> None:
        """Hand the lookup the tokens the last step emitted, and the policy how the continuation it offered
        before that step fared against them."""
        self.lookup.see(emitted)
        self.policy.observe_lookup(*(self._offered or (0, None)), emitted)

    def _choose_and_step(self, last: int, room: int, sampling: SamplingParams, rng, res: GenerationResult):
        continuation, match_len = self.lookup.match(min(self.policy.lookup_max, room)) if room else ([], 0)
        kind, n = self.policy.choose_step(match_len, len(continuation)) if room else PLAIN_STEP
        self._offered = (match_len, continuation) if continuation else None
        if kind == "lookup":
            return self._step(last, n, sampling, rng, res, lookup=continuation[:n])
        if kind == "draft":
            override = continuation if self.combine == "override" else None
            return self._step(last, min(n, room), sampling, rng, res, override=override)
        return self._plain_step(last, sampling, rng, res)

    def _step(self, last: int, n: int, sampling: SamplingParams, rng, res: GenerationResult,
              lookup: list[int] | None = None, override: list[int] | None = None) -> list[int]:
        """One target call; returns the tokens it emits (the last one is not yet decoded). lookup: verify these
        n tokens of the lookup continuation (no draft call); override: the drafter drafts, and the
        continuation's tokens take the slots it covers."""
        pos = self.target.n_past
        t_flush = time.perf_counter()
        flushed = self.drafter.flush() if n > 0 and lookup is None else 0  # rows held back since the last draft
        t0 = time.perf_counter()
        if lookup is not None:
            proposal = Proposal(lookup) if sampling.greedy else point_mass(lookup, self.target.model.n_vocab)
        else:
            proposal = self.draft(last, pos, n, sampling, rng) if n > 0 else Proposal([])
            if override:
                proposal = overridden(proposal, override, sampling.greedy, self.target.model.n_vocab)
        n_looked_up = n if lookup is not None else min(len(override or ()), n)
        drafted, rated = n, proposal
        if proposal.confidence is not None:                                # verify only the slots worth it
            proposal = proposal.first(self.policy.trim(proposal.confidence))
            n = len(proposal.tokens)
        t1 = time.perf_counter()
        rows = self.target.decode_rows([last] + proposal.tokens)          # [n+1, V]
        verdict = self.verify(proposal, rows, sampling, rng)
        t2 = time.perf_counter()
        kept = verdict.n_accepted + 1                                      # last + accepted drafts
        if rated.confidence is not None and self.policy.calibration is not None:
            self._calibrate(rated, n, verdict, sampling)
        if self.drafter is not None:
            features = self.target.features(0, kept)
        self.target.keep(kept, n + 1)                                      # rollback of the target
        if self.drafter is not None:
            self.drafter.process(features, pos)                            # inject the kept rows
        t3 = time.perf_counter()

        res.n_target_calls += 1
        if n == 0:
            res.n_plain_steps += 1
        res.n_drafted += n
        res.n_trimmed += drafted - n
        res.n_accepted += verdict.n_accepted
        res.n_lookup_steps += lookup is not None
        res.n_lookup_drafted += n_looked_up
        res.n_lookup_accepted += min(verdict.n_accepted, n_looked_up)
        if lookup is not None and self._offered and self._offered[0] > self.lookup.max_ngram:
            res.n_corpus_accepted += min(verdict.n_accepted, n_looked_up)
        res.slots.record(n, verdict.n_accepted)
        res.timings.draft_s += t1 - t0
        res.timings.verify_s += t2 - t1
        res.timings.inject_s += (t3 - t2) + (t0 - t_flush)
        # The policy prices a draft with the injection of one step's kept rows, which recurs while speculating.
        # A plain streak's backlog is not a cost of this draft (it goes in before any later one too): counted, it
        # would make a probe's draft look dearer than drafting is and keep the policy plain where drafting pays.
        draft_s = (t1 - t0) + ((t0 - t_flush) if flushed <= self.policy.draft_max + 1 else 0.0)
        self.policy.observe(n, verdict.n_accepted, verify_s=t2 - t1, draft_s=draft_s if drafted else None,
                           draft_n=drafted if drafted != n else None, lookup=lookup is not None)
        if self.debug_check_positions:
            self.check_positions()
        return verdict.emitted(proposal.tokens)

    def _calibrate(self, rated: Proposal, n: int, verdict: Verdict, sampling: SamplingParams) -> None:
        """Count the verified slots' outcomes against the drafter's probabilities, and at greedy the first slot
        left unverified against the token the target emitted in its place."""
        agrees = None
        if sampling.greedy and verdict.n_accepted == n < len(rated.tokens):
            agrees = verdict.next_token == rated.tokens[n]
        self.policy.calibration.record_step(rated.confidence, n, verdict.n_accepted, agrees)

    def _plain_step(self, last: int, sampling: SamplingParams, rng, res: GenerationResult) -> list[int]:
        """One plain decoding step (the plain decoder's, and the policy's fallback): decode `last`, pick the next
        token, hand the row's features to the drafter. Emits what `_step` with n = 0 emits, drawing the same
        random numbers, with nothing else: no draft, no verify bookkeeping, no rollback (docs/fallback-cost.md)."""
        pos = self.target.n_past
        t0 = time.perf_counter()
        token = pick(self.target.decode_rows([last])[0], sampling, rng)
        t1 = time.perf_counter()
        if self.drafter is not None:
            self.drafter.process(self.target.features(0, 1), pos)         # buffered, see DFlashSource
        t2 = time.perf_counter()
        res.n_target_calls += 1
        res.n_plain_steps += 1
        res.timings.verify_s += t1 - t0
        res.timings.inject_s += t2 - t1
        if self.policy.cost is not None:
            self.policy.observe(0, 0, verify_s=t1 - t0)
        if self.debug_check_positions:
            self.check_positions()
        return [token]

    # -- the steps, each replaceable on its own ------------------------------------------------
    def draft(self, last: int, pos: int, n: int, sampling: SamplingParams, rng) -> Proposal:
        stochastic = not sampling.greedy and self.t_mode == "rejection"
        pick_slot = (lambda row: draw(row, sampling, rng)) if stochastic else None
        proposal = self.drafter.draft(last, pos, n, want_logits=stochastic, pick=pick_slot)
        if stochastic and proposal.q is None:                              # slots independent of earlier draws
            q = probs_from_logits(proposal.logits, sampling)               # [n, V]
            proposal = Proposal([sample(q[i], rng) for i in range(n)], proposal.logits, q, proposal.confidence)
        return proposal

    def verify(self, proposal: Proposal, rows: np.ndarray, sampling: SamplingParams, rng) -> Verdict:
        if sampling.greedy:
            return verify_greedy(proposal.tokens, rows.argmax(axis=1))
        p = probs_from_logits(rows, sampling)                              # [n+1, V]
        n = len(proposal.tokens)
        q = proposal.q
        if q is None:                                                      # "match": one-hot proposals
            q = np.zeros((n, p.shape[1]))
            q[np.arange(n), proposal.tokens] = 1.0
        return verify_stochastic(proposal.tokens, q, p, rng)

    @staticmethod
    def _emit(res: GenerationResult, tokens: list[int], max_tokens: int, is_stop, on_tokens) -> bool:
        """Append tokens up to a stop token or the budget; True when generation is over."""
        out, done = [], False
        for t in tokens:
            out.append(t)
            if is_stop(t):
                res.finish_reason, done = "stop", True
                break
            if len(res.tokens) + len(out) >= max_tokens:
                res.finish_reason, done = "length", True
                break
        res.tokens.extend(out)
        if on_tokens is not None and on_tokens(out) is False:
            res.finish_reason, done = "stop", True
        return done

    def check_positions(self) -> None:
        """Target and drafter hold exactly positions 0..n_past-1."""
        t_max = self.target.ctx.pos_max()
        assert t_max == self.target.n_past - 1, (t_max, self.target.n_past)
        d_max = self.drafter.pos_max() if self.drafter is not None else None
        assert d_max is None or d_max == t_max, f"drafter holds up to {d_max}, target up to {t_max}"


def overridden(proposal: Proposal, continuation: list[int], greedy: bool, n_vocab: int) -> Proposal:
    """The drafter's block with its first slots taken by the lookup continuation's tokens; at T > 0 each taken
    slot's q is the point mass on its token (the distribution it was drawn from), the rest keep the drafter's."""
    k = min(len(continuation), len(proposal.tokens))
    tokens = list(continuation[:k]) + proposal.tokens[k:]
    if greedy:
        return Proposal(tokens)
    q = proposal.q
    if q is None:                                   # "match": every slot one-hot, which verify builds itself
        return Proposal(tokens, proposal.logits)
    q = np.array(q)
    q[:k] = point_mass(continuation[:k], n_vocab).q
    return Proposal(tokens, proposal.logits, q)
