"""One bench run: load the engine once, time its cost curve before and after, run every arm prompt by prompt,
and assemble the report (what `--json` writes and table.render prints)."""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UserError, refuse_first


@dataclass(frozen=True)
class BenchOptions:
    prompts: list[Path]
    n_predict: int
    baselines: list[str]             # the arms, plain first (parse_baselines)
    repeat: int
    limit: int | None
    tools_dir: Path | None           # upstream binaries (None: <lib dir>/tools)
    learned: Path | None = None      # a learn store whose answers the lookup also drafts from (serve --learn's)

    def validate(self, cost_curve_only: bool = False, tau: bool = False) -> "BenchOptions":
        """Refuse out-of-range values with the option that sets them (the prompts only where they are read)."""
        if cost_curve_only and tau:
            raise UserError("--tau and --cost-curve-only measure different things: choose one")
        if not self.prompts and not cost_curve_only:
            raise UserError("--prompts: give at least one JSONL file (e.g. --prompts code.jsonl math.jsonl)")
        refuse_first(((self.n_predict >= 2, "-n", self.n_predict,
                       "must be >= 2 (the first token comes from the prefill)"),
                      (self.repeat >= 1, "--repeat", self.repeat, "must be >= 1"),
                      (self.limit is None or self.limit >= 1, "--limit", self.limit, "must be >= 1")))
        if self.learned is not None and (cost_curve_only or tau):
            raise UserError("--learned feeds the lookup and hybrid arms: it has no effect with --tau or "
                            "--cost-curve-only")
        if self.learned is not None and not self.learned.is_dir():
            raise UserError(f"--learned {self.learned}: no such folder (a store serve --learn recorded into)")
        return self


def parse_baselines(spec: str) -> list[str]:
    """--baselines' comma list as the arms to run, in BASELINES order, plain always among them."""
    from .runner import BASELINES
    chosen = list(dict.fromkeys(b.strip() for b in spec.split(",") if b.strip()))
    unknown = [b for b in chosen if b not in BASELINES]
    if unknown:
        raise UserError(f"--baselines: unknown {', '.join(unknown)}; choose from {', '.join(BASELINES)}")
    if "plain" not in chosen:
        chosen.insert(0, "plain")          # every ratio is against plain decoding of the same file
    return sorted(chosen, key=BASELINES.index)


def run(settings, options: BenchOptions, template_choice=None, *, cost_curve_only: bool = False) -> dict:
    """The report of one bench run (or, with `cost_curve_only`, of the cost curve alone). Every arm runs on
    one engine with the drafter loaded (hybrid holds both draft sources); upstream gets our thread count."""
    from ..engine.session import Engine
    from .prompts import read_rows
    rows = None if cost_curve_only else read_rows(options.prompts, options.limit)
    # the arms need both draft sources; the cost curve alone follows --draft-source (lookup, no -md: verify only)
    settings = replace(settings, n_threads=settings.n_threads or os.cpu_count() or 1,
                       draft_source=settings.draft_source if cost_curve_only else "hybrid")
    corpus = None if cost_curve_only else _learned_corpus(settings, options.learned)
    engine = Engine(settings, corpus=corpus)
    try:
        if cost_curve_only:
            curves = [engine.measure_cost_curve() for _ in range(options.repeat)]
            drafter = engine.drafter
            return {"target": str(engine.target_model.path),
                    "drafter": drafter and str(engine.drafter_model.path), "drafter_member": drafter and drafter.member,
                    "threads": settings.n_threads, "n_gpu_layers": settings.n_gpu_layers,
                    "draft_max": engine.draft_max, "lookup_max": engine.lookup_max,
                    "backend": engine.target_model.native.info.get("backend"),
                    "cost_curve": cost_curves_report(drafter is not None and drafter.short_blocks, curves)}
        report = _measure(engine, settings, rows, options, template_choice)
        if corpus is not None:
            report["learned"] = {"store": str(options.learned), "answers": len(corpus), "tokens": corpus.n_tokens}
        return report
    finally:
        engine.close()


def _learned_corpus(settings, store: Path | None):
    """The corpus of this target's answers recorded in `store` (--learned); None without."""
    if store is None:
        return None
    from ..engine.session import check_inputs
    from ..engine.sources.corpus import DEFAULT_MAX_TOKENS, Corpus
    from ..learn.store import LearnStore, Recorder
    target = check_inputs(settings, speculative=True).target
    recorder = Recorder(LearnStore(store), target)
    corpus = Corpus(recorder.recent_answers(DEFAULT_MAX_TOKENS))
    if not len(corpus):
        raise UserError(f"--learned {store}: no answers recorded with {target.name} "
                        f"(sha256 {recorder.target[1][:12]}…); record some first: "
                        f"dflash-gguf serve -m {target} --learn {store}")
    return corpus


def cost_curve_report(short_blocks: bool, start, end=None) -> dict:
    """The verify cost t(B), its ratios to t(1) and the draft cost (per draft length where the drafter runs
    short blocks); with `end`, the mean of two measurements, over the sizes both measured (a calibration that
    would overrun its budget on a slow spell measures fewer: Engine.measure_cost_curve)."""
    end = end or start
    cost_t = {b: (start.t[b] + end.t[b]) / 2 for b in start.t if b in end.t}
    per_n = ({n: (start.t_draft_n[n] + end.t_draft_n[n]) / 2 for n in start.t_draft_n if n in end.t_draft_n}
             if short_blocks and start.t_draft_n and end.t_draft_n else None)
    return {"t_s": cost_t, "t_draft_s": (start.t_draft + end.t_draft) / 2, "t_draft_n_s": per_n,
            "ratios": {b: t / cost_t[1] for b, t in cost_t.items()}, "start": start.to_json(), "end": end.to_json()}


def cost_curves_report(short_blocks: bool, curves: list) -> dict:
    """`--cost-curve-only --repeat K`: K curves measured back to back (each already the median of its rounds), over
    the sizes every one measured. `ratios` is each B's median t(B)/t(1) over the K (a ratio is taken within one
    curve, where both times saw the same spell of a shared machine), `ratio_range` its lowest and highest; t(B) and
    the draft costs are medians of the times; `rounds` holds every curve (a slow spell moved one curve's ratios by
    10-15 % on a 2-core VM, so one number alone says little)."""
    if len(curves) == 1:
        return cost_curve_report(short_blocks, curves[0])
    import numpy as np
    sizes = sorted(set.intersection(*(set(c.t) for c in curves)))
    t = {b: float(np.median([c.t[b] for c in curves])) for b in sizes}
    per_n = None
    if short_blocks and all(c.t_draft_n for c in curves):
        ns = sorted(set.intersection(*(set(c.t_draft_n) for c in curves)))
        per_n = {n: float(np.median([c.t_draft_n[n] for c in curves])) for n in ns}
    ratios = [{b: c.t[b] / c.t[1] for b in sizes} for c in curves]
    return {"t_s": t, "t_draft_s": float(np.median([c.t_draft for c in curves])), "t_draft_n_s": per_n,
            "ratios": {b: float(np.median([r[b] for r in ratios])) for b in sizes},
            "ratio_range": {b: [min(r[b] for r in ratios), max(r[b] for r in ratios)] for b in sizes},
            "rounds": [c.to_json() for c in curves]}


def _measure(engine, settings, rows, options: BenchOptions, template_choice) -> dict:
    """Every arm on every prompt (`options.repeat` times, interleaved), between two cost-curve measurements."""
    from tqdm import tqdm

    from ..native.offload import software_gpus
    from .prompts import prepare
    from .report import summarize
    from .runner import UpstreamSettings, run_bench
    from .upstream import tools_dir as default_tools_dir

    chosen, n_predict, repeat = options.baselines, options.n_predict, options.repeat
    bench_prompts = prepare(rows, engine, template_choice)
    start = engine.measure_cost_curve()
    up = UpstreamSettings(options.tools_dir or default_tools_dir(), engine.drafter_model.path, engine.draft_max,
                          settings.n_threads, settings.n_ctx, settings.n_gpu_layers, settings.cache_type_k,
                          settings.cache_type_v)
    load_before = os.getloadavg()
    with tqdm(total=len(bench_prompts) * len(chosen) * repeat, desc="bench", unit="run", file=sys.stderr) as bar:
        def progress(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)
        runs, missing = run_bench(engine, bench_prompts, n_predict, chosen, repeat, up, progress)
    cost = cost_curve_report(engine.drafter.short_blocks, start, engine.measure_cost_curve())
    report = {
        "target": str(engine.target_model.path), "drafter": str(engine.drafter_model.path),
        "drafter_member": engine.drafter.member,
        "prompt_files": [str(p) for p in options.prompts], "prompts": len(bench_prompts),
        "per_category": {c: sum(p.category == c for p in bench_prompts)
                         for c in dict.fromkeys(p.category for p in bench_prompts)},
        "n_predict": n_predict, "repeat": repeat, "baselines": chosen, "threads": settings.n_threads,
        "n_gpu_layers": settings.n_gpu_layers, "n_ctx": settings.n_ctx,
        "cache_type_k": settings.cache_type_k, "cache_type_v": settings.cache_type_v, "draft_max": engine.draft_max,
        "lookup_max": engine.lookup_max, "adaptive": settings.adaptive,
        "backend": engine.target_model.native.info.get("backend"),
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)",
        "date": time.strftime("%Y-%m-%d %H:%M"), "missing": missing,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "upstream_commands": _upstream_commands(up, engine, n_predict, chosen),
        "warnings": _prompt_mismatches(runs),
        "cost_curve": cost,
        "summary": summarize(runs, cost["t_s"], cost["t_draft_n_s"] or cost["t_draft_s"]),
        "runs": [r.__dict__ for r in runs],
    }
    software = software_gpus(engine.target_model.native) if settings.n_gpu_layers else []
    if software:
        report["note"] = (f"the device is a CPU emulation ({', '.join(software)}): these timings are not "
                          "GPU timings; correctness is real")
    return report


def _upstream_commands(up, engine, n: int, chosen: list[str]) -> dict[str, str]:
    from .upstream import command
    return {b: " ".join(command(up.tools, b, Path(engine.target_model.path), "PROMPT.txt", n,
                                **up.command_settings()))
            for b in chosen if b in ("upstream", "ngram")}


def _prompt_mismatches(runs) -> list[str]:
    """Upstream tokenizes the prompt text itself: say where it saw a different token count than we did."""
    ours = {(r.prompt_id, r.repeat): r.n_prompt for r in runs if r.baseline == "plain"}
    return sorted({f"{r.baseline} saw {r.n_prompt} prompt tokens for {r.prompt_id}, ours {ours[(r.prompt_id, r.repeat)]}"
                   for r in runs if (r.prompt_id, r.repeat) in ours and r.n_prompt != ours[(r.prompt_id, r.repeat)]})
