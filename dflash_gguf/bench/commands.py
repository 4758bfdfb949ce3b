"""`dflash-gguf bench`: honest side-by-side numbers in one run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ..engine_options import chat_template_option, with_engine_options


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
        repeat: int = typer.Option(1, "--repeat",
                                   help="repeat the whole set K times (median and min/max); with --cost-curve-only, "
                                        "K curves: each B's median t(B)/t(1) and its range"),
        limit: Optional[int] = typer.Option(None, "--limit", help="at most N prompts per category"),
        tools_dir: Optional[Path] = typer.Option(None, "--tools-dir",
                                                 help="upstream binaries (default: <lib dir>/tools)"),
        json_out: Optional[Path] = typer.Option(None, "--json", help="write the full report here"),
        plot_out: Optional[Path] = typer.Option(None, "--plot", help="write a PNG here"),
        cost_curve_only: bool = typer.Option(False, "--cost-curve-only",
                                             help="measure only the verify cost t(B)/t(1) and the draft cost "
                                                  "(no prompts needed)"),
        tau: bool = typer.Option(False, "--tau",
                                 help="measure only the drafter's τ per category: full blocks drafted along the "
                                      "target's greedy continuation of each prompt, no timing (for a trained drafter)"),
        learned: Optional[Path] = typer.Option(None, "--learned",
                                               help="the lookup and hybrid arms also draft from the answers recorded "
                                                    "in this folder (serve --learn); answers to these very prompts "
                                                    "in it make them look better than new requests would"),
        chat_template: Optional[str] = chat_template_option(),
        engine_options: dict = None,
    ):
        """Plain vs our draft sources (DFlash, lookup, hybrid) vs upstream C++ DFlash and n-gram, interleaved
        prompt by prompt (--draft-source has no effect here: the arms name the sources)."""
        from ..settings import EngineSettings
        from ..textgen.chat import read_choice
        from .measure import BenchOptions, parse_baselines, run
        from .table import cost_curve_line, render, tau_line

        options = BenchOptions(list(prompts) + list(more_prompts or []), n_predict, parse_baselines(baselines),
                               repeat, limit, tools_dir, learned).validate(cost_curve_only, tau)
        template_choice = read_choice(chat_template)
        settings = EngineSettings.from_env(target=model, drafter=draft, **engine_options)
        if tau:
            from .tau import run_tau
            report = run_tau(settings, options, template_choice)
            print(tau_line(report), file=sys.stderr)
        else:
            report = run(settings, options, template_choice, cost_curve_only=cost_curve_only)
            print(cost_curve_line(report["cost_curve"]) if cost_curve_only else render(report), file=sys.stderr)
        if report.get("learned"):
            x = report["learned"]
            print(f"lookup and hybrid also drafted from {x['answers']} recorded answers ({x['tokens']} tokens) in "
                  f"{x['store']}", file=sys.stderr)
        if report.get("note"):
            print(f"note: {report['note']}", file=sys.stderr)
        if json_out:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(report, indent=1))
        if plot_out and not (cost_curve_only or tau):
            from .plot import plot
            plot(report, plot_out)
