"""How much trimming DFlash's blocks by the drafter's own probabilities can win, replayed offline (docs/draft-trim.md).

`collect`: along the target's greedy continuation of each prompt, at every anchor, the drafter's drafts and top
probabilities for short blocks of 2, 3, 4 and 5 rows and the full block of 8 (NativeDraftProbe, as `bench --tau`).
`simulate`: walks each continuation with a policy, pricing every step with a fixed cost curve in units of t(1), and
prints tokens per t(1) per category: the engine's DraftLengthPolicy without and with trimming (calibration,
emptied-call share), fixed draft lengths, and the hindsight best per step.

    .venv/bin/python lab/draft_trim_sim.py collect -m TARGET -md DRAFTER -o walk.pkl --per 30          # held back
    .venv/bin/python lab/draft_trim_sim.py collect -m TARGET -md DRAFTER -o shared.pkl --per 10 \\
        --prompts ../shared/prompts/code.jsonl ../shared/prompts/math.jsonl ../shared/prompts/chat.jsonl
    .venv/bin/python lab/draft_trim_sim.py simulate walk.pkl [--costs loop]
"""

from __future__ import annotations

import argparse
import pickle
import random
from pathlib import Path

import numpy as np

ROWS = (2, 3, 4, 5, 8)
# t(B)/t(1) right after a draft and draft calls of n tokens, SmolLM2 Q4_K_M, 2 threads: as calibrated (cost cache,
# 2026-11-28), and as the policy's own estimates stood after 12 prompts in the loop (docs/draft-trim.md)
COSTS = {
    "calibrated": ({1: 1.0, 2: 1.22, 3: 1.30, 4: 1.40, 5: 1.48, 6: 1.59, 7: 1.70, 8: 1.80},
                   {1: 0.14, 2: 0.155, 3: 0.16, 4: 0.18, 5: 0.19, 6: 0.20, 7: 0.22}),
    "loop": ({1: 1.0, 2: 1.31, 3: 1.53, 4: 1.68, 5: 1.77, 6: 1.84, 7: 1.91, 8: 1.93},
             {1: 0.23, 2: 0.30, 3: 0.32, 4: 0.32, 5: 0.36, 6: 0.36, 7: 0.36}),
}
VERIFY, DRAFT = COSTS["calibrated"]


def collect(args) -> None:
    from dflash_gguf.bench.prompts import read_rows
    from dflash_gguf.bench.tau import NativeDraftProbe, continuations
    from dflash_gguf.corpus import prompts as corpus
    from dflash_gguf.engine.confidence import top_probabilities
    if args.prompts:
        picked = read_rows([Path(p) for p in args.prompts], args.per)
    else:                                   # the shipped set's held-back part, before the general set at its end
        rows = corpus.load(corpus.DEFAULT_PROMPTS)
        idx = list(range(corpus.HELD_BACK_FROM, len(rows) - 200))
        random.Random(args.seed).shuffle(idx)
        picked, count = [], {}
        for i in idx:
            cat = rows[i].get("category", "chat")
            if count.get(cat, 0) < args.per:
                count[cat] = count.get(cat, 0) + 1
                picked.append({"id": i, **rows[i]})
    probe = NativeDraftProbe(Path(args.model), Path(args.drafter), n_threads=args.threads)
    data = []
    for c in continuations(probe, picked, args.n_predict):
        probe.restart()
        n = len(c.seq)
        blocks = {r: (np.zeros((n, r - 1), np.int32), np.zeros((n, r - 1), np.float32)) for r in ROWS}
        for p in range(c.n_prompt, n - 1):
            probe.driver.inject(c.feats[probe.injected:p], probe.injected)
            probe.injected = p
            for r in ROWS:
                probe.driver.decode_block(c.seq[p], p, r)
                logits = np.array(probe.driver.logits(r))[1:]
                probe.driver.drop_block(p)
                blocks[r][0][p], blocks[r][1][p] = probe.tokens(logits.argmax(axis=1)), top_probabilities(logits)
        data.append({"cat": c.row.get("category", "chat"), "n_prompt": c.n_prompt, "seq": c.seq, "blocks": blocks})
    probe.close()
    Path(args.out).write_bytes(pickle.dumps(data))


def _drafts(rec, p: int, n: int):
    """(drafts, probabilities, slots right) of an n-token draft at anchor p (short block of n+1 rows)."""
    rows = n + 1 if n + 1 in rec["blocks"] else 8
    n = min(n, len(rec["seq"]) - 1 - p)
    tokens, probs = rec["blocks"][rows][0][p][:n], rec["blocks"][rows][1][p][:n]
    return tokens, probs.astype(np.float64), tokens == np.asarray(rec["seq"][p + 1:p + 1 + n])


class EnginePolicy:
    """The engine's DraftLengthPolicy on this cost curve; with `trim`, as the engine runs DFlash by default."""

    def __init__(self, trim: bool):
        from dflash_gguf.engine.confidence import ConfidenceCalibration
        from dflash_gguf.engine.cost import CostCurve
        from dflash_gguf.engine.policy import DraftLengthPolicy
        cost = CostCurve(dict(VERIFY), DRAFT[7], short_blocks=True, t_draft_n=dict(DRAFT),
                         t_cold={b: VERIFY[b] for b in range(2, 9)})
        self.policy = DraftLengthPolicy(7, cost=cost)
        self.policy.use_confidence = trim
        self.policy.calibration = ConfidenceCalibration() if trim else None

    def step(self, rec, p):
        pol = self.policy
        n = pol.choose()
        if n == 0:
            pol.observe(0, 0, verify_s=1.0)
            return 1, 1.0
        tokens, probs, right = _drafts(rec, p, n)
        j = pol.trim(probs) if pol.use_confidence else len(tokens)
        accepted_all = int(np.cumprod(right).sum())
        k = min(accepted_all, j)
        if pol.calibration is not None:
            agrees = bool(right[j]) if (k == j < len(tokens)) else None
            pol.calibration.record_step(probs, j, k, agrees)
        cost = VERIFY[j + 1] + DRAFT[n]
        pol.observe(j, k, verify_s=cost - DRAFT[n], draft_s=DRAFT[n], draft_n=n if j != n else None)
        return k + 1, cost


class Fixed:
    def __init__(self, n: int):
        self.n = n

    def step(self, rec, p):
        _, _, right = _drafts(rec, p, self.n)
        return int(np.cumprod(right).sum()) + 1, VERIFY[len(right) + 1] + DRAFT[self.n]


class Hindsight:
    """The best of plain and 1..4 drafts at each anchor, knowing which are accepted: an upper bound."""

    def step(self, rec, p):
        best = (1, 1.0)
        for n in range(1, 5):
            _, _, right = _drafts(rec, p, n)
            tokens, cost = int(np.cumprod(right).sum()) + 1, VERIFY[len(right) + 1] + DRAFT[n]
            if tokens / cost > best[0] / best[1]:
                best = (tokens, cost)
        return best


def walk(data, policy) -> dict[str, float]:
    out = {}
    for cat in sorted({r["cat"] for r in data}):
        tokens = cost = 0.0
        for rec in (r for r in data if r["cat"] == cat):
            if hasattr(policy, "policy"):
                policy.policy.reset()
            p = rec["n_prompt"]
            while p < len(rec["seq"]) - 1:
                t, c = policy.step(rec, p)
                tokens, cost, p = tokens + t, cost + c, p + t
        out[cat] = tokens / cost
    return out


def simulate(args) -> None:
    global VERIFY, DRAFT
    VERIFY, DRAFT = COSTS[args.costs]
    data = pickle.loads(Path(args.walk).read_bytes())
    arms = [("engine policy, every drafted slot verified", EnginePolicy(False)),
            ("engine policy, blocks trimmed (--draft-trim)", EnginePolicy(True)),
            *((f"always {n} drafts", Fixed(n)) for n in (1, 2, 3)), ("hindsight best per step", Hindsight())]
    for name, policy in arms:
        r = walk(data, policy)
        print(f"{name:44s} " + "  ".join(f"{k} {v:.3f}" for k, v in r.items()) + f"  mean {np.mean(list(r.values())):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("-m", "--model", required=True)
    c.add_argument("-md", "--drafter", required=True)
    c.add_argument("-o", "--out", required=True)
    c.add_argument("--per", type=int, default=30, help="prompts per category")
    c.add_argument("--prompts", nargs="*", help="JSONL prompt files (default: the shipped set's held-back part)")
    c.add_argument("--seed", type=int, default=7)
    c.add_argument("-n", "--n-predict", type=int, default=128)
    c.add_argument("-t", "--threads", type=int, default=2)
    s = sub.add_parser("simulate")
    s.add_argument("walk")
    s.add_argument("--costs", choices=sorted(COSTS), default="calibrated")
    args = ap.parse_args()
    collect(args) if args.cmd == "collect" else simulate(args)


if __name__ == "__main__":
    main()
