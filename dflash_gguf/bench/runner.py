"""Run every baseline on the same prompts, interleaved prompt by prompt, so drift hits all alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .prompts import BenchPrompt

BASELINES = ("plain", "dflash", "lookup", "hybrid", "upstream", "ngram")
OURS = ("plain", "dflash", "lookup", "hybrid")     # our engine: plain decoding and each draft source
WARMUP_TOKENS = 16


@dataclass
class Run:
    """One generation. Rates use n_decoded / decode_s: the decode phase only, prefill excluded."""
    baseline: str
    prompt_id: str
    category: str
    repeat: int
    n_prompt: int
    n_decoded: int                 # tokens produced by the decode loop
    decode_s: float
    n_target_calls: int            # target decodes in the decode loop
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_per_slot: list[int] = field(default_factory=list)    # calls that drafted >= k+1 tokens
    accepted_per_slot: list[int] = field(default_factory=list)   # calls that accepted >= k+1 tokens
    draft_s: float | None = None   # time split of the decode phase (ours only; upstream does not print it)
    verify_s: float | None = None
    inject_s: float | None = None
    python_s: float | None = None
    matches_plain: bool | None = None   # same greedy output as plain decoding of the same prompt
    finish_reason: str | None = None
    attempts: int = 1                   # upstream: processes started to get one complete log
    n_lookup_drafted: int = 0           # of n_drafted, drafts that came from the lookup source
    n_lookup_accepted: int = 0
    n_corpus_accepted: int = 0          # of those, drafted from recorded answers (--learned)


@dataclass
class UpstreamSettings:
    tools: Path
    drafter: Path | None
    draft_max: int
    threads: int
    n_ctx: int
    n_gpu_layers: int
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"

    def command_settings(self) -> dict:
        """upstream.command's keyword arguments."""
        return {k: v for k, v in self.__dict__.items() if k != "tools"}


def run_ours(engine, p: BenchPrompt, n: int, repeat: int, baseline: str) -> tuple[Run, list[int]]:
    res = _generate(engine, p.tokens, n, baseline)
    t = res.timings
    # the prefill emits the first token; the decode loop the rest
    run = Run(baseline, p.id, p.category, repeat, res.n_prompt, len(res.tokens) - 1,
              t.decode_s, res.n_target_calls, res.n_drafted, res.n_accepted, list(res.drafted_per_slot),
              list(res.accepted_per_slot), t.draft_s, t.verify_s, t.inject_s, t.python_s,
              finish_reason=res.finish_reason, n_lookup_drafted=res.n_lookup_drafted,
              n_lookup_accepted=res.n_lookup_accepted, n_corpus_accepted=res.n_corpus_accepted)
    return run, res.tokens


def _generate(engine, tokens: list[int], n: int, baseline: str):
    """Our engine as the arm says: plain decoding, or speculative with that draft source."""
    if baseline == "plain":
        return engine.generate(tokens, n, speculative=False)
    return engine.generate(tokens, n, source=baseline)


def run_upstream(baseline: str, target: Path, p: BenchPrompt, n: int, repeat: int, up: UpstreamSettings,
                 plain_text: str | None) -> Run:
    from .upstream import run  # noqa: PLC0415
    u = run(up.tools, baseline, target, p.upstream_text, n, **up.command_settings())
    # upstream's last verify can accept drafts past -n, so its text may run on after ours: ours must appear whole
    same = None if plain_text is None else plain_text.rstrip() in u.output
    # upstream's decode loop also produces the first token (ours comes from the prefill)
    return Run(baseline, p.id, p.category, repeat, u.n_prompt, u.n_decoded, u.decode_s, u.n_target_calls,
               u.n_drafted, u.n_accepted, matches_plain=same, attempts=u.attempts)


def run_bench(engine, prompts: list[BenchPrompt], n: int, baselines: list[str], repeat: int, up: UpstreamSettings,
              progress: Callable[[str], None] | None = None) -> tuple[list[Run], dict[str, str]]:
    """All runs (repeat-major, then prompt, then baseline) and {baseline: why} for those that could not run.

    A baseline that fails on any prompt is dropped entirely (no partial numbers) and listed as missing.
    """
    from .upstream import BaselineMissing  # noqa: PLC0415
    target = Path(engine.target_model.path)
    missing: dict[str, str] = {}
    _warm_up(engine, prompts[0], n, baselines)
    for b in baselines:                          # probes upstream too: a missing tool fails here, once
        if b not in OURS:
            try:
                run_upstream(b, target, prompts[0], min(n, WARMUP_TOKENS), -1, up, None)
            except BaselineMissing as e:
                missing[b] = str(e)
    runs: list[Run] = []
    for r in range(repeat):
        for p in prompts:
            plain_tokens: list[int] | None = None
            for b in baselines:
                if b in OURS:
                    run, tokens = run_ours(engine, p, n, r, b)
                    if b == "plain":
                        plain_tokens = tokens
                    elif plain_tokens is not None:
                        run.matches_plain = tokens == plain_tokens
                    runs.append(run)
                elif b not in missing:
                    text = None if plain_tokens is None else _as_printed(engine.target_model, plain_tokens)
                    try:
                        runs.append(run_upstream(b, target, p, n, r, up, text))
                    except BaselineMissing as e:
                        missing[b] = f"prompt {p.id}: {e}"
                        runs = [x for x in runs if x.baseline != b]
                if progress:
                    progress(f"{p.category}/{b}")
    return runs, missing


def _warm_up(engine, p: BenchPrompt, n: int, baselines: list[str]) -> None:
    """Graph allocation and first-touch costs are paid before anything is timed."""
    for b in baselines:
        if b in OURS:
            _generate(engine, p.tokens, min(n, WARMUP_TOKENS), b)


def _as_printed(model, tokens: list[int]) -> str:
    """Our tokens rendered the way speculative-simple prints them: special pieces shown, the EOG not printed."""
    data = b"".join(model.token_bytes(t, special=True) for t in tokens if not model.is_eog(t))
    return data.decode("utf-8", "replace")
