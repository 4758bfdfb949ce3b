#!/usr/bin/env python3
"""What a fallback step costs over a plain step: the speculative loop forced to decode plainly vs plain decoding.

The arms `--arms` names, on the same prompts, in one process, interleaved prompt by prompt and shuffled within
each round (drift on a shared machine hits every arm alike):

- plain:    `Engine.generate(speculative=False)`: the target alone, no taps.
- fallback: the speculative loop with a policy that never drafts: every step is a fallback step (taps,
            feature hand-over to the drafter, policy bookkeeping).
- plain_taps (only on request): plain decoding with the taps left on: what tapping alone costs.
- probing:  the same, but the policy's probes run as in a losing regime (a 1-token draft after 16, 32, … 256
            plain steps), so it also pays the injection of the rows buffered in between and the probe drafts.
- dflash, lookup, hybrid: the engine with that draft source and its own adaptive policy (the A/B of issue 33);
  override: hybrid with the lookup continuation put into the drafter's block where the policy picks the drafter.
- always1, always2: the drafter with a fixed policy that drafts 1 (2) tokens every step (what the adaptive policy
  should at least match where slot 1 pays).
- trim: the dflash arm's adaptive policy with `--draft-trim` (blocks trimmed by the drafter's calibrated top
  probabilities; its own policy and calibration, the drafter rating its slots only in this arm).
- optimistic: the dflash arm with lab/policy_variants.py's OptimisticPolicy (α1 at mean + 1.5 sd, not drawn).

Per arm: decode time per token (prefill excluded), median over prompts × rounds, and the per-pair ratio to
plain (median and spread). With `--threads 1 --cpu-clock` the loop's clock is this thread's CPU time (ggml
computes in the calling thread then), robust to other processes taking the cores.

    .venv/bin/python lab/fallback_cost.py --threads 1 --cpu-clock --tokens 128 --per-category 4 --rounds 3
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = Path(__file__).resolve().parent.parent.parent / "shared" / "prompts"


def _own_curve(engine):
    """A copy of the engine's cost curve: an arm's timings then move its own prices only."""
    from dflash_gguf.engine.cost import CostCurve
    return CostCurve.from_json(engine.cost.to_json())


def _policy(engine, probes: bool):
    """The engine's policy on a text where speculation never pays (an infinite margin): plain steps, and with
    `probes` its probes (a 1-token draft after 16, 32, … 256 plain steps)."""
    from dflash_gguf.engine.policy import DraftLengthPolicy
    return DraftLengthPolicy(engine.draft_max, adaptive=True, cost=_own_curve(engine), margin=float("inf"),
                             probe_every=16 if probes else 1 << 30)


def _policy_like(policy):
    """A fresh adaptive policy with the same settings and cost curve."""
    from dflash_gguf.engine.policy import DraftLengthPolicy
    return DraftLengthPolicy(policy.draft_max, policy.draft_min, adaptive=policy.adaptive, cost=policy.cost)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu-clock", action="store_true", help="with --threads 1: time this thread's CPU time")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=Path, default=PROMPTS)
    ap.add_argument("--arms", default="plain,fallback,probing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-m", "--model", type=Path, help="target GGUF (default: the embedded default)")
    ap.add_argument("-md", "--drafter", type=Path, help="drafter GGUF (default: the shipped one)")
    a = ap.parse_args(argv)
    if a.cpu_clock and a.threads != 1:
        ap.error("--cpu-clock measures the calling thread: use it with --threads 1")

    from dflash_gguf.bench.prompts import prepare, read_rows
    from dflash_gguf.engine import loop
    from dflash_gguf.engine.confidence import ConfidenceCalibration
    from dflash_gguf.engine.policy import DraftLengthPolicy
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.native.cpu_kernels import CpuKernels
    from dflash_gguf.native.lib import load
    from dflash_gguf.settings import EngineSettings
    from lab.policy_variants import OptimisticPolicy

    if a.cpu_clock:
        loop.time = types.SimpleNamespace(perf_counter=time.thread_time)
    engine = Engine(EngineSettings(n_threads=a.threads, target=a.model, drafter=a.drafter))
    if a.cpu_clock:               # the policy compares online timings with the curve: calibrate on the same clock
        from dflash_gguf.engine import session
        session.time = loop.time
        engine.target.time_verify = functools.partial(engine.target.time_verify, clock=time.thread_time)
        engine.cost.__dict__.update(engine.measure_cost_curve().__dict__)
    files = sorted(a.prompts.glob("*.jsonl"))
    prompts = prepare(read_rows(files, a.per_category), engine)
    arms = a.arms.split(",")
    policies = {"fallback": _policy(engine, probes=False), "probing": _policy(engine, probes=True),
                "always1": DraftLengthPolicy(1, adaptive=False), "always2": DraftLengthPolicy(2, adaptive=False),
                "trim": DraftLengthPolicy(engine.draft_max, adaptive=True, cost=_own_curve(engine)),
                "optimistic": OptimisticPolicy(engine.draft_max, adaptive=True, cost=_own_curve(engine))}
    policies["trim"].calibration = ConfidenceCalibration()
    spec = engine.decoder("dflash")                   # the fallback arms swap the policy of a decoder of their own
    engine.spec = loop.SpecDecoder(engine.target, engine.drafter, spec.policy, t_mode=spec.t_mode)
    hybrid = engine.decoder("hybrid")
    override = loop.SpecDecoder(engine.target, engine.drafter, _policy_like(hybrid.policy), t_mode=hybrid.t_mode,
                                lookup=type(hybrid.lookup)(hybrid.lookup.n_vocab, hybrid.lookup.block_size),
                                combine="override")

    def run(arm: str, tokens: list[int], n: int):
        if arm == "plain":
            return engine.generate(tokens, n, speculative=False)
        if arm == "plain_taps":                     # plain decoding with the target's taps left on
            return engine.plain.generate(tokens, n)
        if arm in ("dflash", "lookup", "hybrid"):
            return engine.generate(tokens, n, source=arm)
        if arm == "override":
            return override.generate(tokens, n)
        engine.spec.policy = policies[arm]
        engine.drafter.rates_slots = arm == "trim"
        try:
            return engine.generate(tokens, n)
        finally:
            engine.drafter.rates_slots = False

    for arm in arms:                                  # warm-up: graphs, buffers
        run(arm, prompts[0].tokens, 16)
    per_token: dict[str, list[float]] = {arm: [] for arm in arms}
    ratios: dict[str, list[float]] = {arm: [] for arm in arms if arm != "plain"}
    extra: dict[str, dict[str, float]] = {arm: {"probes": 0, "steps": 0, "inject_s": 0.0, "draft_s": 0.0,
                                                "decode_s": 0.0, "tokens": 0} for arm in arms}
    by_category: dict[tuple[str, str], list[float]] = {}
    rng = random.Random(a.seed)
    for _ in range(a.rounds):
        for p in prompts:
            order = list(arms)
            rng.shuffle(order)
            got, toks = {}, {}
            for arm in order:
                res = run(arm, p.tokens, a.tokens)
                got[arm] = res.timings.decode_s / max(len(res.tokens) - 1, 1)
                toks[arm] = res.tokens
                x = extra[arm]
                x["probes"] += res.n_target_calls - res.n_plain_steps
                x["steps"] += res.n_target_calls
                x["inject_s"] += res.timings.inject_s
                x["draft_s"] += res.timings.draft_s
                x["decode_s"] += res.timings.decode_s
                x["tokens"] += max(len(res.tokens) - 1, 1)
            for arm in arms:
                per_token[arm].append(got[arm])
                if arm != "plain":
                    assert toks[arm] == toks["plain"], f"{arm} output differs from plain on {p.id}"
                    ratios[arm].append(got[arm] / got["plain"])
                    by_category.setdefault((arm, p.category), []).append(got[arm] / got["plain"])
    out = {"isa": CpuKernels(load()).isa, "threads": a.threads, "clock": "thread_cpu" if a.cpu_clock else "wall",
           "tokens": a.tokens, "prompts": len(prompts), "rounds": a.rounds, "arms": {}}
    for arm in arms:
        ts = per_token[arm]
        row = {"ms_per_token_median": round(statistics.median(ts) * 1e3, 4),
               "ms_per_token_min": round(min(ts) * 1e3, 4), "ms_per_token_max": round(max(ts) * 1e3, 4),
               "steps": extra[arm]["steps"], "drafting_steps": extra[arm]["probes"],
               "inject_ms_per_step": round(1e3 * extra[arm]["inject_s"] / max(extra[arm]["steps"], 1), 4),
               "draft_ms_per_step": round(1e3 * extra[arm]["draft_s"] / max(extra[arm]["steps"], 1), 4)}
        if arm in ratios:
            rs = sorted(ratios[arm])
            q = len(rs) // 4
            row.update({"ratio_to_plain_median": round(statistics.median(rs), 4),
                        "ratio_min": round(rs[0], 4), "ratio_max": round(rs[-1], 4),
                        "ratio_iqr": [round(rs[q], 4), round(rs[-1 - q], 4)]})
            row["ratio_median_by_category"] = {c: round(statistics.median(v), 4)
                                               for (b, c), v in sorted(by_category.items()) if b == arm}
            # the whole run: every prompt's tokens at its own speed (a median of per-prompt ratios weighs a prompt
            # where drafting wins a little as much as one where it loses a lot)
            row["speedup_total"] = round((extra["plain"]["decode_s"] / extra["plain"]["tokens"])
                                         / (extra[arm]["decode_s"] / extra[arm]["tokens"]), 4) \
                if "plain" in extra else None
        out["arms"][arm] = row
    print(json.dumps(out, indent=1))
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
