"""Aggregate runs into rates and ratios. Every number is computed from the measured times in the runs.

Per category (and "all") and baseline, each repeat is pooled over its prompts (tokens / seconds), then
median, min and max are taken over repeats. Definitions (all per repeat):
- tok_s = Σ n_decoded / Σ decode_s;  speedup = tok_s / tok_s(plain);  τ = Σ n_decoded / Σ target calls
- limit = τ · t(1) / mean over target calls of (t(B) + t_draft(B)), with t(B) the measured verify-cost
  curve, B = drafted + 1 for each call and t_draft(B) the measured cost of a draft of B − 1 tokens (one
  figure unless the drafter runs short blocks) for B > 1, 0 for B = 1 (a plain step);
  efficiency = speedup / limit
- limit_measured = τ · (plain seconds per token) / (verify + draft seconds per call, both from this run);
  efficiency_measured = speedup / limit_measured (= the share of decode time spent in verify + draft)
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..engine.cost import interp_value
from .runner import BASELINES, Run

SPLIT = ("draft", "verify", "inject", "python")


def pooled(runs: list[Run]) -> dict:
    """Totals of one (category, baseline, repeat) group."""
    tokens = sum(r.n_decoded for r in runs)
    seconds = sum(r.decode_s for r in runs)
    calls = sum(r.n_target_calls for r in runs)
    drafted, accepted = sum(r.n_drafted for r in runs), sum(r.n_accepted for r in runs)
    out = {"prompts": len(runs), "tokens": tokens, "decode_s": seconds, "target_calls": calls,
           "tok_s": tokens / seconds if seconds > 0 else None, "tau": tokens / calls if calls else None,
           "n_drafted": drafted, "n_accepted": accepted, "acceptance": accepted / drafted if drafted else None,
           "n_lookup_drafted": sum(r.n_lookup_drafted for r in runs),
           "n_lookup_accepted": sum(r.n_lookup_accepted for r in runs)}
    width = max((len(r.drafted_per_slot) for r in runs), default=0)
    d, a = np.zeros(width), np.zeros(width)
    for r in runs:
        d[:len(r.drafted_per_slot)] += r.drafted_per_slot
        a[:len(r.accepted_per_slot)] += r.accepted_per_slot
    if d.sum() > 0:
        out["drafted_per_slot"] = [int(x) for x in d]
        out["acceptance_per_slot"] = [float(x) for x in np.divide(a, d, out=np.zeros(width), where=d > 0)]
    checked = [r.matches_plain for r in runs if r.matches_plain is not None]
    if checked:
        out["identical_to_plain"] = f"{sum(checked)}/{len(checked)}"
    if calls and all(r.verify_s is not None for r in runs):
        out["seconds"] = {k: sum(getattr(r, f"{k}_s") for r in runs) for k in SPLIT}
    return out


def calls_by_batch(p: dict) -> dict[int, int]:
    """Target calls per verify batch B (= drafted + 1), from the per-slot draft counts."""
    d = p.get("drafted_per_slot") or []
    at_least = [p["target_calls"]] + d                  # calls that drafted >= 0, >= 1, ...
    hist = {k + 1: at_least[k] - (at_least[k + 1] if k + 1 < len(at_least) else 0) for k in range(len(at_least))}
    return {b: c for b, c in hist.items() if c}


def draft_cost(t_draft: float | dict[int, float], n: int) -> float:
    """Seconds of a draft call of n tokens: one figure, or per n where the drafter runs n+1 rows."""
    return interp_value(t_draft, n) if isinstance(t_draft, dict) else t_draft


def curve_limit(p: dict, cost_t: dict[int, float], t_draft: float | dict[int, float]) -> float | None:
    if not p["tau"] or not cost_t:
        return None
    hist = calls_by_batch(p)
    step = sum(c * (interp_value(cost_t, b) + (draft_cost(t_draft, b - 1) if b > 1 else 0.0))
               for b, c in hist.items()) / sum(hist.values())
    return p["tau"] * cost_t[1] / step


def measured_limit(p: dict, plain: dict) -> float | None:
    sec = p.get("seconds")
    if not (sec and p["tau"] and plain["tokens"] and p["target_calls"]):
        return None
    per_call = (sec["verify"] + sec["draft"]) / p["target_calls"]
    return p["tau"] * (plain["decode_s"] / plain["tokens"]) / per_call if per_call > 0 else None


def spread(values: list) -> dict:
    v = [x for x in values if x is not None]
    if not v:
        return {"median": None, "min": None, "max": None}
    return {"median": float(np.median(v)), "min": float(min(v)), "max": float(max(v))}


def _ratio(a, b):
    return a / b if a is not None and b else None


def summarize(runs: list[Run], cost_t: dict[int, float], t_draft: float) -> dict:
    """{category: {baseline: entry}}; categories sorted with "all" last."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        for cat in (r.category, "all"):
            groups[(cat, r.baseline, r.repeat)].append(r)
    cats = sorted({k[0] for k in groups}, key=lambda c: (c == "all", c))
    repeats = sorted({k[2] for k in groups})
    out = {}
    for cat in cats:
        per = {}
        for b in BASELINES:
            reps = {rep: pooled(groups[(cat, b, rep)]) for rep in repeats if groups.get((cat, b, rep))}
            if reps:
                per[b] = _entry(b, reps, {rep: pooled(groups[(cat, "plain", rep)]) for rep in reps
                                          if groups.get((cat, "plain", rep))}, cost_t, t_draft)
                per[b]["all_repeats"] = pooled([r for rep in reps for r in groups[(cat, b, rep)]])
                per[b]["time_split"] = time_split(per[b]["all_repeats"])
        out[cat] = per
    return out


def _entry(b: str, reps: dict[int, dict], plains: dict[int, dict], cost_t, t_draft) -> dict:
    e = {"repeats": len(reps),
         "per_repeat": [{k: reps[rep][k] for k in ("tokens", "decode_s", "target_calls", "tok_s", "tau")} for rep in reps],
         "tok_s": spread([p["tok_s"] for p in reps.values()]), "tau": spread([p["tau"] for p in reps.values()])}
    if b != "plain" and plains:
        speed = {rep: _ratio(reps[rep]["tok_s"], plains[rep]["tok_s"]) for rep in reps if rep in plains}
        e["speedup"] = spread(list(speed.values()))
        if b == "dflash":
            lim = {rep: curve_limit(reps[rep], cost_t, t_draft) for rep in speed}
            mlim = {rep: measured_limit(reps[rep], plains[rep]) for rep in speed}
            e["limit"] = spread(list(lim.values()))
            e["efficiency"] = spread([_ratio(speed[rep], lim[rep]) for rep in speed])
            e["limit_measured"] = spread(list(mlim.values()))
            e["efficiency_measured"] = spread([_ratio(speed[rep], mlim[rep]) for rep in speed])
    return e


def time_split(p: dict) -> dict | None:
    """Milliseconds per target call and share of the decode time (pooled totals)."""
    sec = p.get("seconds")
    if not sec or not p["target_calls"]:
        return None
    return {k: {"ms_per_call": 1000 * sec[k] / p["target_calls"], "share": sec[k] / p["decode_s"]} for k in SPLIT}
