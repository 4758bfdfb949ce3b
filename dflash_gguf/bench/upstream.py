"""Upstream llama.cpp baselines built from the same patched tree: its C++ DFlash driver and n-gram mode.

Each run is one `llama-speculative-simple` process (build it with `dflash-gguf build --tools`); we parse
the timings and counters it prints. A baseline that cannot run is reported as missing with the reason,
never as a zero.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

TOOL = "llama-speculative-simple"
# baseline name -> extra llama-speculative-simple arguments (besides model, prompt, threads, ...)
SPEC_ARGS = {
    "upstream": ["--spec-type", "draft-dflash"],          # + -md DRAFTER --spec-draft-n-max N
    "ngram": ["--spec-type", "ngram-simple"],             # llama.cpp defaults: n=12, m=48 (docs/speculative.md)
}

_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")


class BaselineMissing(RuntimeError):
    """The baseline cannot run here; str() says why."""


@dataclass
class UpstreamRun:
    n_prompt: int          # tokens upstream encoded (checked against ours)
    n_decoded: int         # tokens generated in the decode loop (the first one included)
    decode_s: float
    n_drafted: int
    n_accepted: int
    output: str            # stdout: the prompt echo followed by the generated text
    attempts: int = 1      # > 1: an earlier process exited 0 but its log lost the summary lines

    @property
    def n_target_calls(self) -> int:
        return self.n_decoded - self.n_accepted        # every target call yields its accepted drafts + 1


def tools_dir() -> Path:
    from ..native.lib import find_lib_dir  # noqa: PLC0415
    return find_lib_dir() / "tools"


def command(tools: Path, baseline: str, target: Path, prompt_file: str, n_generate: int, *, drafter: Path | None,
            draft_max: int, threads: int, n_ctx: int, n_gpu_layers: int, cache_type_k: str = "f16",
            cache_type_v: str = "f16") -> list[str]:
    """The exact command line; n_generate is the total number of tokens to produce after the prompt."""
    # speculative-simple stops once it has produced more than -n tokens, i.e. -n + 1 of them
    cmd = [str(tools / TOOL), "-m", str(target), "-f", prompt_file, "--no-escape", "-n", str(max(n_generate - 1, 1)),
           "--temp", "0", "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-ngl", str(n_gpu_layers),
           "-ctk", cache_type_k, "-ctv", cache_type_v, *SPEC_ARGS[baseline]]
    if baseline == "upstream":
        if drafter is None:
            raise BaselineMissing("no drafter to give upstream's DFlash driver")
        cmd += ["-md", str(drafter), "-ngld", str(n_gpu_layers), "-td", str(threads), "-tbd", str(threads),
                "--spec-draft-n-max", str(draft_max), "-ctkd", cache_type_k, "-ctvd", cache_type_v]
    return cmd


class LogLost(BaselineMissing):
    """The process succeeded but its asynchronous logger dropped the summary (seen under heavy CPU load)."""


def run(tools: Path, baseline: str, target: Path, prompt_text: str, n_generate: int, *, timeout: float = 600,
        attempts: int = 3, **settings) -> UpstreamRun:
    for attempt in range(1, attempts + 1):
        try:
            result = _run_once(tools, baseline, target, prompt_text, n_generate, timeout, settings)
            result.attempts = attempt
            return result
        except LogLost:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def _run_once(tools: Path, baseline: str, target: Path, prompt_text: str, n_generate: int, timeout: float,
              settings: dict) -> UpstreamRun:
    exe = tools / TOOL
    if not exe.exists():
        raise BaselineMissing(f"{exe} not built (run: dflash-gguf build --tools)")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(prompt_text + "\n")        # -f drops one trailing newline; this keeps the prompt exact
        prompt_file = f.name
    cmd = command(tools, baseline, target, prompt_file, n_generate, **settings)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BaselineMissing(f"{TOOL} {' '.join(SPEC_ARGS[baseline])} timed out after {timeout:.0f} s") from None
    except OSError as e:
        raise BaselineMissing(f"{exe} cannot start: {e}") from None
    finally:
        Path(prompt_file).unlink(missing_ok=True)
    return parse(out.stdout, out.stderr, out.returncode, baseline)


def parse(stdout: str, stderr: str, returncode: int, baseline: str) -> UpstreamRun:
    """Counters and timings from speculative-simple's log (stderr) and the text it wrote (stdout)."""
    log = stderr + "\n" + stdout
    enc, dec = _ENCODED.search(log), _DECODED.search(log)
    d, a = _DRAFTED.search(log), _ACCEPT.search(log)
    if returncode != 0 or not (enc and dec and d and a):
        tail = " | ".join(line.strip() for line in log.strip().splitlines()[-3:])
        error = LogLost if returncode == 0 else BaselineMissing
        why = "printed no timings" if returncode == 0 else "failed"
        raise error(f"{TOOL} {' '.join(SPEC_ARGS[baseline])} {why} (exit {returncode}): {tail}")
    return UpstreamRun(int(enc.group(1)), int(dec.group(1)), float(dec.group(2)), int(d.group(1)), int(a.group(1)),
                       stdout)
