"""How often the speculative loop runs a kept compute graph, and what a change of batch shape costs
(patches/0017, docs/fallback-cost.md).

`count`: generates on shared prompts with the drafter and prints how many target and drafter decodes built a graph.
`switch`: times target decodes of one width back to back and of two widths in turn (each rolled back, as a
rejected verify is). Compare builds with DFLASH_GGUF_LIB_DIR, or the reuse itself with LLAMA_GRAPH_REUSE_DISABLE=1.

    .venv/bin/python lab/graph_reuse.py count -m TARGET --per 4
    .venv/bin/python lab/graph_reuse.py switch -m TARGET --widths 1 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from dflash_gguf.bench.prompts import read_rows
from dflash_gguf.engine.session import Engine
from dflash_gguf.native.wrappers import Context
from dflash_gguf.settings import EngineSettings
from dflash_gguf.textgen.prompting import format_prompt

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "prompts"


class DecodeCounter:
    """Counts Context.decode calls per context while installed."""

    def __init__(self):
        self.calls: dict[int, int] = {}
        self._decode = Context.decode

    def __enter__(self):
        counter, decode = self, self._decode

        def counted(ctx, batch, what="decode"):
            counter.calls[id(ctx)] = counter.calls.get(id(ctx), 0) + 1
            return decode(ctx, batch, what)
        Context.decode = counted
        return self

    def __exit__(self, *exc):
        Context.decode = self._decode


def count(args) -> None:
    engine = Engine(EngineSettings(target=Path(args.model), n_threads=args.threads, draft_source="dflash"))
    decoder = engine.decoder("dflash")
    contexts = {"target": decoder.target.ctx, "drafter": decoder.drafter.ctx}
    rows = read_rows([SHARED / f"{c}.jsonl" for c in ("code", "math", "chat")], args.per)
    reused0 = {k: c.graphs_reused() for k, c in contexts.items()}
    tokens = 0
    with DecodeCounter() as counter:
        for row in rows:
            tokens += len(engine.generate(format_prompt(engine.target_model, row, None), args.n_predict).tokens)
    out = {"tokens": tokens}
    for name, ctx in contexts.items():
        decodes = counter.calls.get(id(ctx), 0)
        out[name] = {"decodes": decodes, "built": decodes - (ctx.graphs_reused() - reused0[name])}
    print(json.dumps(out))
    engine.close()


def switch(args) -> None:
    engine = Engine(EngineSettings(target=Path(args.model), n_threads=args.threads, draft_source="dflash"),
                    calibrate=False)
    target = engine.decoder("dflash").target
    target.reset()
    target.prefill(list(range(1000, 1000 + args.context)), None)
    patterns = [[w] for w in args.widths] + [list(args.widths)]
    for pattern in patterns:
        times = {w: [] for w in pattern}
        for _ in range(args.calls):
            for w in pattern:
                times[w].append(target.time_verify([1234] * w))
        label = "back to back" if len(pattern) == 1 else "in turn"
        print(label, {w: f"{1e3 * np.median(v):.2f} ms" for w, v in times.items()})
    engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("count")
    c.add_argument("-m", "--model", required=True)
    c.add_argument("--per", type=int, default=4, help="shared prompts per category")
    c.add_argument("-n", "--n-predict", type=int, default=128)
    c.add_argument("-t", "--threads", type=int, default=2)
    s = sub.add_parser("switch")
    s.add_argument("-m", "--model", required=True)
    s.add_argument("--widths", type=int, nargs="+", default=[1, 3])
    s.add_argument("--calls", type=int, default=150)
    s.add_argument("--context", type=int, default=200, help="positions decoded before timing")
    s.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    {"count": count, "switch": switch}[args.cmd](args)


if __name__ == "__main__":
    main()
