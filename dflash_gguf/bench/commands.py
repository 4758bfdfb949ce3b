"""`dflash-gguf bench`: honest side-by-side numbers in one run."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ..engine_options import chat_template_option, with_engine_options
from ..errors import UserError


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"help_option_names": ["-h", "--help"]})
    @with_engine_options
    def bench(
        model: Optional[Path] = typer.Option(None, "-m", "--model", help="target GGUF (default: embedded SmolLM2)"),
        draft: Optional[Path] = typer.Option(None, "-md", "--model-draft", help="DFlash drafter GGUF"),
        prompts: list[Path] = typer.Option([], "--prompts",
                                           help="JSONL files with 'prompt' (+ 'id', 'category'): --prompts A B C"),
        more_prompts: Optional[list[Path]] = typer.Argument(None, metavar="MORE.jsonl", show_default=False),
        n_predict: int = typer.Option(128, "-n", "--n-predict", help="tokens to generate per prompt"),
        baselines: str = typer.Option("plain,dflash,lookup,hybrid,upstream,ngram", "--baselines",
                                      help="comma list of plain, dflash, lookup, hybrid (ours: each draft source), "
                                           "upstream (C++ DFlash), ngram (C++ n-gram)"),
        repeat: int = typer.Option(1, "--repeat", help="repeat the whole set K times (median and min/max)"),
        limit: Optional[int] = typer.Option(None, "--limit", help="at most N prompts per category"),
        tools_dir: Optional[Path] = typer.Option(None, "--tools-dir",
                                                 help="upstream binaries (default: <lib dir>/tools)"),
        json_out: Optional[Path] = typer.Option(None, "--json", help="write the full report here"),
        plot_out: Optional[Path] = typer.Option(None, "--plot", help="write a PNG here"),
        chat_template: Optional[str] = chat_template_option(),
        engine_options: dict = None,
    ):
        """Plain vs our draft sources (DFlash, lookup, hybrid) vs upstream C++ DFlash and n-gram, interleaved
        prompt by prompt (--draft-source has no effect here: the arms name the sources)."""
        from tqdm import tqdm

        from ..engine.session import Engine, check_inputs, require_native
        from ..native.offload import software_gpus
        from ..settings import EngineSettings, parse_devices as _devices
        from .prompts import prepare, read_rows
        from .report import summarize
        from .runner import BASELINES, UpstreamSettings, run_bench
        from .upstream import tools_dir as default_tools_dir

        chosen = _baselines(baselines, BASELINES)
        prompts = list(prompts) + list(more_prompts or [])
        if not prompts:
            raise UserError("--prompts: give at least one JSONL file (e.g. --prompts code.jsonl math.jsonl)")
        if n_predict < 2:
            raise UserError(f"-n must be >= 2 (the first token comes from the prefill), got {n_predict}")
        if repeat < 1:
            raise UserError(f"--repeat must be >= 1, got {repeat}")
        if limit is not None and limit < 1:
            raise UserError(f"--limit {limit}: must be >= 1")
        rows = read_rows(prompts, limit)
        from ..textgen.chat import read_choice
        template_choice = read_choice(chat_template)
        settings = EngineSettings.from_env(target=model, drafter=draft, **engine_options)
        threads = settings.n_threads or os.cpu_count() or 1         # upstream baselines get the same count
        settings = replace(settings, n_threads=threads, draft_source="hybrid")   # the drafter loaded for every arm
        ctx_size, n_gpu_layers = settings.n_ctx, settings.n_gpu_layers
        check_inputs(settings)
        require_native(settings)
        engine = Engine(settings)
        try:
            bench_prompts = prepare(rows, engine, template_choice)
            start = engine.measure_cost_curve()
            up = UpstreamSettings(tools_dir or default_tools_dir(), engine.drafter_model.path, engine.draft_max,
                                  threads, ctx_size, n_gpu_layers)
            load_before = os.getloadavg()
            with tqdm(total=len(bench_prompts) * len(chosen) * repeat, desc="bench", unit="run",
                      file=sys.stderr) as bar:
                def progress(label: str) -> None:
                    bar.set_postfix_str(label, refresh=False)
                    bar.update(1)
                runs, missing = run_bench(engine, bench_prompts, n_predict, chosen, repeat, up, progress)
            end = engine.measure_cost_curve()
            cost_t = {b: (start.t[b] + end.t[b]) / 2 for b in start.t}
            t_draft = (start.t_draft + end.t_draft) / 2
            short = engine.drafter.short_blocks and start.t_draft_n and end.t_draft_n
            per_n = {n: (start.t_draft_n[n] + end.t_draft_n[n]) / 2 for n in start.t_draft_n} if short else None
            report = {
                "target": str(engine.target_model.path), "drafter": str(engine.drafter_model.path),
                "drafter_member": engine.drafter.member,
                "prompt_files": [str(p) for p in prompts], "prompts": len(bench_prompts),
                "per_category": {c: sum(p.category == c for p in bench_prompts)
                                 for c in dict.fromkeys(p.category for p in bench_prompts)},
                "n_predict": n_predict, "repeat": repeat, "baselines": chosen, "threads": threads,
                "n_gpu_layers": n_gpu_layers, "n_ctx": ctx_size, "draft_max": engine.draft_max,
                "adaptive": settings.adaptive, "backend": engine.target_model.native.info.get("backend"),
                "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)",
                "date": time.strftime("%Y-%m-%d %H:%M"), "missing": missing,
                "load_average": {"before": load_before, "after": os.getloadavg()},
                "upstream_commands": _upstream_commands(up, engine, n_predict, chosen),
                "warnings": _prompt_mismatches(runs),
                "cost_curve": {"t_s": cost_t, "t_draft_s": t_draft, "t_draft_n_s": per_n,
                               "ratios": {b: t / cost_t[1] for b, t in cost_t.items()},
                               "start": start.to_json(), "end": end.to_json()},
                "summary": summarize(runs, cost_t, per_n or t_draft),
                "runs": [r.__dict__ for r in runs],
            }
            software = software_gpus(engine.target_model.native) if n_gpu_layers else []
            if software:
                report["note"] = (f"the device is a CPU emulation ({', '.join(software)}): these timings are not "
                                  "GPU timings; correctness is real")
        finally:
            engine.close()
        from .table import render
        print(render(report), file=sys.stderr)
        if report.get("note"):
            print(f"note: {report['note']}", file=sys.stderr)
        if json_out:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(report, indent=1))
        if plot_out:
            from .plot import plot
            plot(report, plot_out)


def _baselines(spec: str, known: tuple[str, ...]) -> list[str]:
    chosen = list(dict.fromkeys(b.strip() for b in spec.split(",") if b.strip()))
    unknown = [b for b in chosen if b not in known]
    if unknown:
        raise UserError(f"--baselines: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    if "plain" not in chosen:
        chosen.insert(0, "plain")          # every ratio is against plain decoding of the same file
    return sorted(chosen, key=known.index)


def _upstream_commands(up, engine, n: int, chosen: list[str]) -> dict[str, str]:
    from .upstream import command  # noqa: PLC0415
    return {b: " ".join(command(up.tools, b, Path(engine.target_model.path), "PROMPT.txt", n, drafter=up.drafter,
                                draft_max=up.draft_max, threads=up.threads, n_ctx=up.n_ctx,
                                n_gpu_layers=up.n_gpu_layers))
            for b in chosen if b in ("upstream", "ngram")}


def _prompt_mismatches(runs) -> list[str]:
    """Upstream tokenizes the prompt text itself: say where it saw a different token count than we did."""
    ours = {(r.prompt_id, r.repeat): r.n_prompt for r in runs if r.baseline == "plain"}
    return sorted({f"{r.baseline} saw {r.n_prompt} prompt tokens for {r.prompt_id}, ours {ours[(r.prompt_id, r.repeat)]}"
                   for r in runs if (r.prompt_id, r.repeat) in ours and r.n_prompt != ours[(r.prompt_id, r.repeat)]})
