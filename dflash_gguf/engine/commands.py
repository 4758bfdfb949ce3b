"""`dflash-gguf run`: stream a generation, then report τ, speed and acceptance per slot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ..engine_options import chat_template_option, learn_max_mb_option, learn_option, with_engine_options
from ..errors import UserError

DEMO_PROMPT = "Write a Python function that returns the n-th prime number, with a docstring and two examples."


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"help_option_names": ["-h", "--help"]})
    @with_engine_options
    def run(
        model: Optional[Path] = typer.Option(None, "-m", "--model", help="target GGUF (default: embedded SmolLM2)"),
        draft: Optional[Path] = typer.Option(None, "-md", "--model-draft", help="DFlash drafter GGUF"),
        prompt: Optional[str] = typer.Option(None, "-p", "--prompt", help="prompt text"),
        file: Optional[Path] = typer.Option(None, "-f", "--file", help="read the prompt from a file"),
        chat: bool = typer.Option(False, "--chat", help="apply the model's chat template to the prompt"),
        think: Optional[bool] = typer.Option(None, "--think/--no-think", help="thinking, where the template has it"),
        n_predict: int = typer.Option(256, "-n", "--n-predict", help="tokens to generate"),
        temp: float = typer.Option(0.0, "--temp", help="temperature (0 = greedy)"),
        top_k: int = typer.Option(0, "--top-k"),
        top_p: float = typer.Option(1.0, "--top-p"),
        min_p: float = typer.Option(0.0, "--min-p"),
        seed: Optional[int] = typer.Option(None, "--seed"),
        compare: Optional[bool] = typer.Option(None, "--compare/--no-compare",
                                               help="also run plain decoding and report the speedup"),
        plain: bool = typer.Option(False, "--plain", help="plain decoding only (no drafter)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of streaming"),
        chat_template: Optional[str] = chat_template_option(),
        learn: Optional[Path] = learn_option(),
        learn_max_mb: float = learn_max_mb_option(),
        engine_options: dict = None,
    ):
        """Generate with DFlash speculative decoding (lossless); without -m/-md runs the embedded default."""
        from ..settings import EngineSettings
        from .session import Engine, check_inputs

        demo = prompt is None and file is None
        if prompt is not None and file is not None:
            raise UserError("give the prompt with -p or -f, not both")
        sampling = check_sampling_options(n_predict, temp, top_k, top_p, min_p, seed)
        if file is not None:
            if not file.is_file():
                raise UserError(f"-f {file}: no such file")
            prompt = file.read_text(encoding="utf-8", errors="replace")
        if demo:
            prompt, chat = DEMO_PROMPT, True
            compare = True if compare is None else compare
        from ..textgen.chat import read_choice
        template_choice = read_choice(chat_template)
        settings = EngineSettings.from_env(target=model, drafter=draft, **engine_options)
        inputs = check_inputs(settings, speculative=not plain)
        from ..learn.store import recorder_for
        from .sources.corpus import DEFAULT_MAX_TOKENS, Corpus
        recorder = recorder_for(learn, learn_max_mb, inputs.target)
        if recorder is not None:
            print(recorder.announce(), file=sys.stderr)
        corpus = Corpus(recorder.recent_answers(DEFAULT_MAX_TOKENS)) if recorder is not None else None
        engine = Engine(inputs, speculative=not plain, corpus=corpus)
        try:
            tokens, template = _prompt_tokens(engine, prompt, chat, think, template_choice)
            report = _generate(engine, tokens, n_predict, sampling, stream=not as_json, speculative=not plain)
            if recorder is not None and report["tokens"]:
                recorder.record(tokens, report["tokens"], template=template,
                                drafter=getattr(engine.drafter_model, "path", None))
            if compare and not plain:
                base = engine.generate(tokens, n_predict, sampling, speculative=False)
                report["plain"] = {"tok_s": round(base.tok_s, 2), "n_generated": len(base.tokens)}
                report["speedup"] = round(report["stats"]["tok_s"] / base.tok_s, 3) if base.tok_s else None
                if sampling.greedy:
                    report["identical_to_plain"] = base.tokens == report["tokens"]
        finally:
            engine.close()
        if as_json:
            typer.echo(json.dumps(report))
        else:
            _print_summary(report)


RUN_FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p"}


def check_sampling_options(n_predict: int, temp: float, top_k: int, top_p: float, min_p: float,
                           seed: int | None):
    """SamplingParams from run's options, refusing out-of-range values with the flag that set them."""
    from .sampling import SamplingParams
    if n_predict < 1:
        raise UserError(f"-n {n_predict}: must be >= 1 (tokens to generate)")
    sampling = SamplingParams(temp, top_k, top_p, min_p, seed)
    found = sampling.problem(RUN_FLAGS)
    if found:
        raise UserError(found[1])
    return sampling


def _prompt_tokens(engine, prompt: str, chat: bool, think: bool | None, template_choice=None
                   ) -> tuple[list[int], str | None]:
    """The prompt's tokens, and the chat template it was rendered with (None without --chat)."""
    model = engine.target_model
    if not chat:
        return model.tokenize(prompt, add_special=True), None
    from ..textgen.chat import model_template, render_model_chat, supports_thinking
    template = model_template(model, template_choice)
    if not template.is_models_own:
        print(f"chat template: {template.source}", file=sys.stderr)
    if think is not None and not supports_thinking(template.text):
        print(f"note: {model.path.name}'s chat template has no thinking switch; --think/--no-think ignored",
              file=sys.stderr)
        think = None
    text = render_model_chat(model, [{"role": "user", "content": prompt}], template=template.text,
                             enable_thinking=think)
    return model.tokenize(text, add_special=False), template.text


def _generate(engine, tokens, n_predict, sampling, *, stream: bool, speculative: bool) -> dict:
    from .text import TextStream
    text = TextStream(engine.target_model.token_bytes)

    def on_tokens(new):
        chunk = text.feed(new)
        if stream and chunk:
            sys.stdout.write(chunk)
            sys.stdout.flush()

    res = engine.generate(tokens, n_predict, sampling, on_tokens, speculative=speculative)
    tail = text.finish()
    if stream:
        sys.stdout.write(tail + "\n")
        sys.stdout.flush()
    return {"text": text.text, "tokens": res.tokens, "stats": res.stats(),
            "draft_max": engine.draft_max if speculative else 0,
            "cost_ratios": engine.cost.ratios() if engine.cost else None}


def _print_summary(report: dict) -> None:
    s = report["stats"]
    lines = [f"tokens: {s['n_generated']} (prompt {s['n_prompt']}), {s['tok_s']} tok/s, "
             f"τ = {s['tau']} tokens per target call ({s['n_target_calls']} calls, {s['n_plain_steps']} plain)",
             f"drafted {s['n_drafted']}, accepted {s['n_accepted']} (lookup: {s['n_lookup_drafted']}, "
             f"{s['n_lookup_accepted']}" + (f", {s['n_corpus_accepted']} of them from recorded answers"
                                            if s.get("n_corpus_accepted") else "")
             + "); acceptance per slot: " + " ".join(f"{x:.2f}" for x in s["acceptance_per_slot"]),
             f"time: prefill {s['prefill_s']} s, draft {s['draft_s']} s, verify {s['verify_s']} s, "
             f"inject {s['inject_s']} s, python {s['python_ms_per_step']} ms/step"]
    if "plain" in report:
        lines.append(f"plain decoding: {report['plain']['tok_s']} tok/s → speedup {report['speedup']}×"
                     + (f", output identical: {report['identical_to_plain']}" if "identical_to_plain" in report else ""))
        if report.get("identical_to_plain") is False:
            lines.append("note: llama.cpp computes slightly different logits for a batch than for one token on "
                         "quantized weights, so a near-tie can resolve differently in verify than in plain decoding; "
                         "with F16/F32 weights the outputs are identical (tests/test_engine.py)")
    print("\n".join(lines), file=sys.stderr)
