"""τ of a drafter on real prompts, measured the way greedy speculative decoding would see it.

The target writes its greedy continuation; then, walking along it, the drafter (llama.cpp `dflash`
graph, fed the target's tapped features of every position before the anchor) drafts a full block
at each anchor, the leading drafts that equal the continuation are accepted, and the next anchor
is the token after them. Greedy verification is lossless, so this is exactly the accepted length
of a greedy speculative run, without depending on any particular decoding loop.

τ = tokens after the first / blocks drafted (accepted + 1 per target call). Code prompts are raw
completions; math and chat go through the target's chat template, as in training. `bench --tau` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UserError


@dataclass
class TauReport:
    by_category: dict[str, float]                 # τ per category (pooled over its prompts)
    prompts: dict[str, int]                       # prompts measured per category
    slot_accept: list[float]                      # P(slot k accepted | slots < k accepted), k = 1..B-1
    per_prompt: list[dict] = field(default_factory=list)

    @property
    def overall(self) -> float:
        calls = sum(p["calls"] for p in self.per_prompt)
        return sum(p["tokens"] - 1 for p in self.per_prompt) / calls if calls else 0.0

    def to_json(self) -> dict:
        return {"tau": {k: round(v, 3) for k, v in self.by_category.items()}, "tau_overall": round(self.overall, 3),
                "prompts": self.prompts,
                "slot_accept": [round(x, 3) for x in self.slot_accept]}


class NativeDraftProbe:
    """Target and drafter through llama.cpp, drafting a full block at any anchor of a target-written sequence
    from the target's tapped features, injected into the drafter's KV as the engine injects them."""

    N_CTX = 2048

    def __init__(self, target: Path, drafter: Path, n_threads: int = 0):
        from ..engine.drafter_driver import DrafterDriver  # noqa: PLC0415
        from ..native.wrappers import Batch, Context, ContextSettings, Model  # noqa: PLC0415
        self.target, self.drafter = Model(target), Model(drafter)
        self.tctx = Context(self.target, ContextSettings(n_ctx=self.N_CTX, n_batch=512, n_ubatch=512,
                                                         n_threads=n_threads))
        self.driver = DrafterDriver(self.drafter, self.tctx, ContextSettings(n_ctx=self.N_CTX, n_batch=64, n_ubatch=64,
                                                                             n_threads=n_threads))
        self.taps, self.block = self.driver.taps, self.driver.block_size
        self.d2t = self.driver.use_draft_vocab_rows()    # a reduced vocabulary's rows in head order, as the engine
        self.tbatch = Batch(self.target.native, 512)
        self.injected = 0

    def continuation(self, prompt: list[int], max_new: int) -> tuple[list[int], np.ndarray]:
        """prompt + the target's greedy continuation, and the tapped features [len(seq), k*H] of all of it;
        the drafter's KV is cleared for a new sequence."""
        from ..textgen.greedy import greedy_continuation, prefill_features  # noqa: PLC0415
        seq = prompt + greedy_continuation(self.target, self.tctx, self.tbatch, prompt, max_new)
        feats = prefill_features(self.tctx, self.tbatch, self.taps, seq)
        self.restart()
        return seq, feats

    def restart(self) -> None:
        """Clear the drafter's KV for a new sequence."""
        self.driver.ctx.clear()
        self.injected = 0

    def draft_at(self, seq: list[int], feats: np.ndarray, p: int) -> np.ndarray:
        """[B-1] greedy drafts for slots 1..B-1 of the block anchored at seq[p]; anchors must not go back."""
        self.driver.inject(feats[self.injected:p], self.injected)     # context: every position before p
        self.injected = p
        self.driver.decode_block(seq[p], p, self.block)
        # rows 1..B-1: DFlash, and DSpark as `train --markov-rank` writes it (the graph applies its Markov chain)
        drafts = self.tokens(np.asarray(self.driver.logits(self.block))[1:].argmax(axis=1))
        self.driver.drop_block(p)
        return drafts

    def tokens(self, columns: np.ndarray) -> np.ndarray:
        """Target token ids of logit columns of the last block (a reduced vocabulary's rows are in head order)."""
        return columns if self.d2t is None else self.d2t[columns]

    def close(self) -> None:
        for obj in (self.tbatch, self.driver, self.tctx, self.drafter, self.target):
            obj.close()


def run_tau(settings, options, template_choice=None) -> dict:
    """`bench --tau`: the report of τ on the bench prompts, with the files and settings it was measured with."""
    import os  # noqa: PLC0415

    from ..engine.session import check_inputs  # noqa: PLC0415
    from .prompts import read_rows  # noqa: PLC0415
    inputs = check_inputs(settings)
    target, drafter = inputs.target, inputs.drafter
    if drafter is None:
        raise UserError("--tau measures a drafter: give one with -md (--draft-source lookup has none)")
    threads = settings.n_threads or os.cpu_count() or 1
    template = None if template_choice is None else template_choice.text
    report = measure_tau(drafter, target, read_rows(options.prompts, options.limit), options.n_predict, threads,
                         template)
    return {"target": str(target), "drafter": str(drafter), "threads": threads, "n_predict": options.n_predict,
            **report.to_json(), "per_prompt": report.per_prompt}


@dataclass
class Continuation:
    """One prompt and the target's greedy continuation of it, with the tapped features of every position: what
    any drafter of these taps is walked along (the target's part does not depend on the drafter)."""
    row: dict
    n_prompt: int
    seq: list[int]
    feats: np.ndarray            # [len(seq), k*H]


def continuations(probe: NativeDraftProbe, prompts: list[dict], max_tokens: int,
                  template: str | None = None) -> list[Continuation]:
    """Rows of a prompt file (formatted with `template` as in training), or rows whose `tokens` are the prompt as
    the target reads it (a recorded request, rendered as it was served)."""
    from ..textgen.prompting import format_prompt  # noqa: PLC0415
    out = []
    for row in prompts:
        prompt = list(row["tokens"] if "tokens" in row else format_prompt(probe.target, row, template))
        prompt = prompt[: probe.N_CTX // 2]
        seq, feats = probe.continuation(prompt, min(max_tokens, probe.N_CTX - len(prompt) - probe.block))
        out.append(Continuation(row, len(prompt), seq, feats))
    return out


def walk_blocks(probe: NativeDraftProbe, c: Continuation):
    """(anchor p, drafts n, accepted k) of each block along one continuation, as a greedy speculative run takes
    them: seq[p] is the newest token, not yet verified; the next anchor follows the k accepted and the target's."""
    seq = c.seq
    probe.restart()
    p = c.n_prompt
    while p < len(seq) - 1:
        drafts = probe.draft_at(seq, c.feats, p)
        n = min(probe.block - 1, len(seq) - 1 - p)
        k = int(np.cumprod(drafts[:n] == np.asarray(seq[p + 1:p + 1 + n])).sum())
        yield p, n, k
        p += k + 1


def walk_tau(probe: NativeDraftProbe, conts: list[Continuation]) -> TauReport:
    """τ of the probe's drafter along each continuation, as a greedy speculative run would accept its drafts."""
    from ..engine.acceptance import Walk  # noqa: PLC0415
    block = probe.block
    walk = Walk()
    calls: dict[str, int] = {}
    made: dict[str, int] = {}
    per_prompt = []
    for c in conts:
        cat, seq = c.row.get("category", "chat"), c.seq
        n_calls = 0
        for _, n, k in walk_blocks(probe, c):
            walk.block(k, n)
            n_calls += 1
        generated = len(seq) - c.n_prompt
        calls[cat] = calls.get(cat, 0) + n_calls
        made[cat] = made.get(cat, 0) + generated - 1
        per_prompt.append({"id": c.row.get("id"), "category": cat, "tokens": generated, "calls": n_calls,
                           "tau": round((generated - 1) / n_calls, 3) if n_calls else None})
    counts = {c: sum(1 for p in per_prompt if p["category"] == c) for c in calls}
    return TauReport({c: made[c] / calls[c] for c in calls if calls[c]}, counts,
                     walk.slot_accept + [0.0] * (block - 1 - len(walk.slot_accept)), per_prompt)


def measure_tau(drafter: Path, target: Path, prompts: list[dict], max_tokens: int = 128,
                n_threads: int = 0, template: str | None = None) -> TauReport:
    """τ of `drafter` over `prompts` (rows as `continuations` takes them)."""
    return measure_taus([drafter], target, prompts, max_tokens, n_threads, template)[0]


def measure_taus(drafters: list[Path], target: Path, prompts: list[dict], max_tokens: int = 128,
                 n_threads: int = 0, template: str | None = None) -> list[TauReport]:
    """τ of each drafter (all of the same taps) over the same continuations, generated once."""
    probe = NativeDraftProbe(target, drafters[0], n_threads)
    try:
        conts = continuations(probe, prompts, max_tokens, template)
        reports, taps = [walk_tau(probe, conts)], probe.taps
    finally:
        probe.close()
    for d in drafters[1:]:
        probe = NativeDraftProbe(target, d, n_threads)
        try:
            if probe.taps != taps:             # the features kept are those of the first drafter's taps
                raise UserError(f"{d}: taps {probe.taps}, not {drafters[0]}'s {taps}; measure them separately")
            reports.append(walk_tau(probe, conts))
        finally:
            probe.close()
    return reports
