"""The draft-length policy replayed on recorded acceptance (docs/policy.md).

`collect`: along the target's greedy answer to each prompt, at every position, how many tokens of an n-token draft
(short blocks of n + 1 rows, n = 1..7) the target accepts. Greedy verification keeps the longest prefix that matches
the target's own continuation, and the drafter's context is the same whatever the policy did before, so one walk
serves every policy.
`replay`: walks each answer with a policy (the engine's DraftLengthPolicy, with the weighing before 2026-11-30 and
now) or a fixed draft length, pricing each step from a cost model in units of t(1) with a little noise, and prints
tokens per t(1) over plain decoding per category; `--keep p` also replays the walk with every accepted slot kept with
probability p (a drafter that suits the text less).

    .venv/bin/python lab/policy_replay.py collect -o design.pkl                       # held-back training prompts
    .venv/bin/python lab/policy_replay.py collect -o shared.pkl --shared ../shared/prompts
    .venv/bin/python lab/policy_replay.py replay design.pkl --keep 1 0.6 0.35
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
from pathlib import Path

import numpy as np

N_MAX = 7
# Cost models in units of the plain arm's t(1): `verify_cold` a verify right after a draft, `draft` (n) the draft call,
# injection of the kept rows and the loop's own work; `calibrated` what the cost cache measured for the same files, the
# curve the policy starts from.
COSTS = {
    # SmolLM2 Q4_K_M with the shipped drafter, 2 threads, Zen 3, from the arms that always draft 1, 2 or 3 tokens
    # (2026-11-30)
    "zen3": dict(verify_cold={1: 1.0, 2: 1.137, 3: 1.319, 4: 1.487}, verify_step=0.17, draft=(0.177, 0.016),
                 calibrated=dict(t={1: 1, 2: 1.201, 3: 1.37, 4: 1.374, 6: 1.757, 8: 2.012, 12: 2.8, 16: 3.6},
                                 cold={2: 1.237, 3: 1.269, 4: 1.331, 5: 1.653, 7: 1.754, 8: 1.867},
                                 draft={1: 0.131, 2: 0.131, 3: 0.128, 4: 0.16, 6: 0.172, 7: 0.183})),
    # the same files on the same Zen 3 guest after Q5_0's bit planes (2026-12-07, eighth session): bench runs 117-120's
    # calibrations, the cold verifies and draft calls of an in-process run of the dflash arm
    "zen3b": dict(verify_cold={1: 1.0, 2: 1.20, 3: 1.40, 4: 1.60}, verify_step=0.22, draft=(0.17, 0.02),
                  calibrated=dict(t={1: 1, 2: 1.173, 3: 1.382, 4: 1.636, 6: 2.066, 8: 2.499, 12: 3.605, 16: 4.674},
                                  cold={2: 1.205, 3: 1.544, 4: 1.536, 5: 1.708, 7: 2.139, 8: 2.413},
                                  draft={1: 0.151, 2: 0.193, 3: 0.156, 4: 0.174, 6: 0.202, 7: 0.238})),
    # the same files on the Zen 1 (2026-12-05): a 1-draft step cost 1.45-1.53 t(1) in always-1 runs; the calibration
    # of the same night
    "zen1": dict(verify_cold={1: 1.0, 2: 1.36, 3: 1.68, 4: 2.02}, verify_step=0.33, draft=(0.14, 0.032),
                 calibrated=dict(t={1: 1, 2: 1.321, 3: 1.659, 4: 2.035, 6: 2.71, 8: 3.324, 12: 4.889, 16: 6.35},
                                 cold={2: 1.314, 3: 1.631, 4: 1.977, 5: 2.415, 7: 3.08, 8: 3.316},
                                 draft={1: 0.110, 2: 0.145, 3: 0.175, 4: 0.207, 6: 0.268, 7: 0.307})),
    # the same files on the Emerald Rapids guest (2026-12-05, bench runs 91-93: t(1) 3.9-5.5 ms, the file in L3): its
    # calibration; cold verifies taken as the warm ones (not timed apart), a draft call 0.18 t(1) whatever its rows
    "emr": dict(verify_cold={1: 1.0, 2: 1.20, 3: 1.28, 4: 1.40}, verify_step=0.17, draft=(0.18, 0.0),
                calibrated=dict(t={1: 1, 2: 1.20, 3: 1.28, 4: 1.40, 6: 1.74, 8: 2.10, 12: 3.04, 16: 3.71},
                                cold={2: 1.20, 3: 1.28, 4: 1.40, 5: 1.57, 7: 1.92, 8: 2.10},
                                draft={1: 0.18, 2: 0.18, 3: 0.18, 4: 0.18, 6: 0.18, 7: 0.18})),
}
COST = COSTS["zen3"]
T1 = 0.008


def verify_cost(b: int) -> float:
    cold = COST["verify_cold"]
    return cold.get(b, cold[4] + COST["verify_step"] * (b - 4))


def draft_cost(n: int) -> float:
    first, per_row = COST["draft"]
    return first + per_row * (n - 1)


def _prompts(args) -> list[dict]:
    if args.shared:
        rows = []
        for cat in ("code", "math", "chat"):
            lines = (Path(args.shared) / f"{cat}.jsonl").read_text().splitlines()[:args.per]
            rows += [dict(json.loads(line), cat=cat, raw=False) for line in lines]
        return rows
    from dflash_gguf.corpus import prompts as corpus
    held = corpus.load(corpus.DEFAULT_PROMPTS)[corpus.HELD_BACK_FROM:]
    rng = random.Random(args.seed)
    rows = []
    for cat in ("code", "math", "chat"):
        pool = [r for r in held if r["category"] == cat]
        rows += [dict(r, cat=cat, raw=r["format"] == "completion") for r in rng.sample(pool, args.per)]
    return rows


def collect(args) -> None:
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.settings import EngineSettings
    from dflash_gguf.textgen.chat import render_model_chat
    extra = {"drafter": Path(args.drafter)} if args.drafter else {}
    eng = Engine(EngineSettings(target=Path(args.model) if args.model else None, n_threads=args.threads,
                                draft_source="dflash", **extra))
    target, drafter = eng.target, eng.drafter
    drafter.short_blocks = True
    out = []
    for row in _prompts(args):
        text = row["prompt"] if row["raw"] else render_model_chat(target.model, [{"role": "user", "content": row["prompt"]}])
        prompt = eng.tokenize(text, add_special=row["raw"])
        answer = eng.generate(prompt, args.n_predict, speculative=False).tokens
        target.reset()
        drafter.begin()
        target.prefill(prompt, drafter.process)
        acc = np.zeros((len(answer), N_MAX + 1), np.int8)
        full = np.zeros(len(answer), np.int8)       # leading slots of the whole trained block that match
        for j in range(len(answer) - 1):
            pos = target.n_past
            for n in range(1, N_MAX + 2):
                drafter.short_blocks = n <= N_MAX        # n = N_MAX + 1: every slot of the trained block
                drafts = drafter.draft(answer[j], pos, min(n, drafter.block_size - 1), want_logits=False).tokens
                k = 0
                while k < len(drafts) and j + 1 + k < len(answer) and drafts[k] == answer[j + 1 + k]:
                    k += 1
                if n <= N_MAX:
                    acc[j, n] = k
                else:
                    full[j] = k
            target.decode_rows([answer[j]])
            features = target.features(0, 1)
            target.keep(1, 1)
            drafter.process(features, pos)
        out.append(dict(cat=row["cat"], n=len(answer), acc=acc, full=full))
        print(row["cat"], len(answer), f"slot-1 acceptance {(acc[:-1, 1] > 0).mean():.3f}", flush=True)
    Path(args.out).write_bytes(pickle.dumps(out))


def _policy(kind: str):
    from dflash_gguf.engine.cost import CostCurve
    from dflash_gguf.engine.policy import DraftLengthPolicy
    from policy_variants import MeanOrDrawPolicy, OptimisticPolicy, StreakPolicy
    calibrated = COST["calibrated"]
    curve = CostCurve({b: v * T1 for b, v in calibrated["t"].items()}, 0.2 * T1, short_blocks=True,
                      t_draft_n={n: v * T1 for n, v in calibrated["draft"].items()},
                      t_cold={b: v * T1 for b, v in calibrated["cold"].items()})
    before = dict(explore=False, recheck=32, carry_weight=4)       # the mean, weighed every 32 plain steps
    if kind.startswith("optimistic"):                               # "optimistic1.5": z = 1.5
        return OptimisticPolicy(N_MAX, 1, cost=curve, z=float(kind[len("optimistic"):] or 1.5))
    if kind == "maxdraw":                                           # draft where α1's mean or its draw pays
        return MeanOrDrawPolicy(N_MAX, 1, cost=curve)
    if kind.startswith("streak"):                                   # "streak8": implied t(1) after 8 draft steps
        return StreakPolicy(N_MAX, 1, cost=curve, streak=int(kind[len("streak"):] or 8))
    if kind.startswith("carry"):                                    # "carry32": the carried α counts 32 observations
        return DraftLengthPolicy(N_MAX, 1, cost=curve, carry_weight=float(kind[len("carry"):]))
    return DraftLengthPolicy(N_MAX, 1, cost=curve, **(before if kind == "before" else {}))


def _tally(totals: dict[str, list[float]], cat: str, n_tok: int, seconds: float) -> None:
    """Add one answer: plain decoding's time for its tokens, and the time the walk took."""
    t = totals.setdefault(cat, [0.0, 0.0])
    t[0] += (n_tok - 1) * T1
    t[1] += seconds


def _speedups(totals: dict[str, list[float]]) -> dict[str, float]:
    """Tokens per t(1) over plain decoding per category and over all answers."""
    out = {c: t[0] / t[1] for c, t in totals.items()}
    out["all"] = sum(t[0] for t in totals.values()) / sum(t[1] for t in totals.values())
    return out


def walk(traces: list[dict], kind: str, seed: int, noise: float = 0.08) -> dict[str, float]:
    """Tokens per t(1) over plain decoding per category; kind: "before", "now", "optimistic<z>"
    (lab/policy_variants.py) or a fixed draft length."""
    rng = np.random.default_rng(seed)
    policy = None if kind.isdigit() else _policy(kind)
    totals: dict[str, list[float]] = {}
    for tr in traces:
        if policy is not None:
            policy.reset()
        acc, n_tok = tr["acc"], tr["n"]
        j, seconds = 0, 0.0
        while j < n_tok - 1:
            n = min(int(kind) if policy is None else policy.choose(), n_tok - 2 - j, N_MAX)
            if n <= 0:
                v = T1 * np.exp(rng.normal(0, noise))
                seconds, j = seconds + v, j + 1
                if policy is not None:
                    policy.observe(0, 0, verify_s=v)
                continue
            a = int(acc[j, n])
            v = T1 * verify_cost(n + 1) * np.exp(rng.normal(0, noise))
            d = T1 * draft_cost(n) * np.exp(rng.normal(0, noise))
            seconds, j = seconds + v + d, j + a + 1
            if policy is not None:
                policy.observe(n, a, verify_s=v, draft_s=d)
        _tally(totals, tr["cat"], n_tok, seconds)
    return _speedups(totals)


def walk_tail(traces: list[dict], n_draft: int, n_tail: int, seed: int, noise: float = 0.08) -> dict[str, float]:
    """Tokens per t(1) over plain decoding when every step drafts `n_draft` tokens from the whole trained block and,
    where the target emitted the block's own argmax for each slot so far, verifies up to `n_tail` of the block's
    later slots instead (no draft call, the target's weights still in the caches). n_tail 0: no tail steps."""
    from dflash_gguf.engine.cost import interp_value
    rng = np.random.default_rng(seed)
    totals: dict[str, list[float]] = {}
    full_cost = draft_cost(N_MAX)
    for tr in traces:
        full, n_tok = tr["full"], tr["n"]
        j, seconds, offered, valid = 0, 0.0, 0, 0
        while j < n_tok - 1:
            left = n_tok - 2 - j
            if offered and n_tail:
                m = min(n_tail, offered, left)
                if m <= 0:
                    offered = 0
                    continue
                a = min(m, valid)
                warm = interp_value(COST["calibrated"]["t"], m + 1, monotone=True)   # no draft call before it
                seconds += T1 * warm * np.exp(rng.normal(0, noise))
                offered, valid = (offered - m - 1, valid - m - 1) if valid > m else (0, 0)
                j += a + 1
                continue
            n = min(n_draft, left)
            if n <= 0:
                seconds, j = seconds + T1 * np.exp(rng.normal(0, noise)), j + 1
                continue
            a = min(n, int(full[j]))
            seconds += T1 * (verify_cost(n + 1) + full_cost) * np.exp(rng.normal(0, noise))
            offered, valid = (N_MAX - n - 1, int(full[j]) - n - 1) if full[j] > n else (0, 0)
            j += a + 1
        _tally(totals, tr["cat"], n_tok, seconds)
    return _speedups(totals)


def keep_accepted(traces: list[dict], keep: float, seed: int = 0) -> list[dict]:
    """Each accepted slot survives with probability `keep`; acceptance stops at the first lost one."""
    rng = np.random.default_rng(seed)
    out = []
    for tr in traces:
        acc = tr["acc"].copy()
        for j, n in np.ndindex(acc.shape):
            k = 0
            while k < acc[j, n] and rng.random() < keep:
                k += 1
            acc[j, n] = k
        out.append(dict(tr, acc=acc))
    return out


def _seed_mean(run, seeds: int) -> dict[str, float]:
    """Each category's speedup averaged over the noise seeds 0..seeds-1 (run(seed): one walk's speedups)."""
    runs = [run(seed) for seed in range(seeds)]
    return {c: round(float(np.mean([r[c] for r in runs])), 3) for c in runs[0]}


def replay(args) -> None:
    global COST
    COST = COSTS[args.costs]
    traces = pickle.loads(Path(args.walk).read_bytes())
    for keep in args.keep:
        data = traces if keep >= 1 else keep_accepted(traces, keep)
        share = np.mean(np.concatenate([t["acc"][:-1, 1] > 0 for t in data]))
        print(f"accepted slots kept {keep}: slot-1 acceptance {share:.3f}")
        for kind in ("1", "2", "3", "before", "now", *args.variants):
            mean = _seed_mean(lambda seed: walk(data, kind, seed, args.noise), args.seeds)
            print(f"  {kind if not kind.isdigit() else 'always ' + kind:>8}: {mean}")
        if "full" in data[0] and keep >= 1:
            for n_draft, n_tail in args.tail:
                mean = _seed_mean(lambda seed: walk_tail(data, n_draft, n_tail, seed, args.noise), args.seeds)
                print(f"  full block, {n_draft} drafts, tail {n_tail}: {mean}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("-m", "--model", help="target (default: the embedded default)")
    c.add_argument("-md", "--drafter")
    c.add_argument("-o", "--out", required=True)
    c.add_argument("--per", type=int, default=12, help="prompts per category")
    c.add_argument("--shared", help="a folder of code/math/chat JSONL prompt files (evaluation only)")
    c.add_argument("--seed", type=int, default=7)
    c.add_argument("-n", "--n-predict", type=int, default=128)
    c.add_argument("-t", "--threads", type=int, default=2)
    r = sub.add_parser("replay")
    r.add_argument("walk")
    r.add_argument("--keep", type=float, nargs="*", default=[1.0])
    r.add_argument("--seeds", type=int, default=4)
    r.add_argument("--costs", choices=sorted(COSTS), default="zen3", help="the cost model (see COSTS)")
    r.add_argument("--noise", type=float, default=0.08, help="log-normal spread of each timing")
    r.add_argument("--variants", nargs="*", default=[],
                   help="more policies to replay: optimistic<z> (lab/policy_variants.py), e.g. optimistic1.5; "
                        "carry<w>: the engine's policy with the carried α weighing w observations")
    r.add_argument("--tail", type=lambda v: tuple(int(x) for x in v.split(",")), nargs="*", default=[],
                   help="n_draft,n_tail pairs: whole-block drafts with tail steps (walk_tail), e.g. 1,0 1,1 1,2")
    args = ap.parse_args()
    collect(args) if args.cmd == "collect" else replay(args)


if __name__ == "__main__":
    main()
