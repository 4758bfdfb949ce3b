"""One settings model for the CLI, environment variables (DFLASH_GGUF_*) and the server."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class EngineSettings:
    target: Path | None = None           # None: the embedded default (SmolLM2-135M-Instruct)
    drafter: Path | None = None          # None: the shipped drafter for the default target
    n_ctx: int = 4096
    n_threads: int = 0                   # 0: all cores
    n_batch: int = 512
    n_gpu_layers: int = 0
    fit: bool = False                    # choose n_gpu_layers / n_cpu_moe from free VRAM
    draft_max: int | None = None         # None: block size - 1
    draft_min: int = 1
    adaptive: bool = True
    draft_ctx: int | None = None         # drafter KV window; None: the target's n_ctx
    draft_n_gpu_layers: int | None = None
    t_mode: str = "rejection"            # T>0 verification: "rejection" | "match"
    flash_attn: str = "auto"
    n_cpu_moe: int = 0
    cpu_moe: bool = False
    override_tensor: tuple[str, ...] = ()        # "REGEX=BUFT"
    draft_override_tensor: tuple[str, ...] = ()
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    rpc: str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_env(cls, **overrides) -> "EngineSettings":
        """Defaults, then DFLASH_GGUF_<FIELD> environment variables, then explicit overrides (not None)."""
        values = {}
        for f in fields(cls):
            raw = os.environ.get(f"DFLASH_GGUF_{f.name.upper()}")
            if raw is not None and f.name != "extra":
                values[f.name] = _parse(f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)


def _parse(type_name, raw: str):
    t = str(type_name)
    if "Path" in t:
        return Path(raw)
    if t.startswith("bool"):
        return raw.lower() in ("1", "true", "yes", "on")
    if t.startswith("int"):
        return int(raw)
    if "tuple[str" in t:
        return tuple(x for x in raw.split(",") if x)
    if "tuple[float" in t:
        return tuple(float(x) for x in raw.split(",") if x)
    return raw
