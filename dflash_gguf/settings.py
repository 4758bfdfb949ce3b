"""One settings model for the CLI, environment variables (DFLASH_GGUF_*) and the server."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .errors import UserError, refuse_first
from .native import BACKENDS

T_MODES = ("rejection", "match")    # T>0 verification: speculative sampling, or match a target sample
DRAFT_SOURCES = ("dflash", "lookup", "hybrid")  # the drafter; prompt lookup (no drafter file); both, per step
FLASH_ATTN_MODES = ("auto", "on", "off")
# llama.cpp's -ctk / -ctv types (common/arg.cpp kv_cache_types) and their bytes per value (ggml block sizes);
# a quantized V cache needs flash attention
KV_CACHE_TYPES = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                  "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}
UNQUANTIZED_KV = ("f32", "f16", "bf16")
MIN_CTX = 128                        # the verify-cost calibration decodes 64 context tokens + a block


@dataclass(frozen=True)
class EngineSettings:
    target: Path | None = None           # None: the embedded default (SmolLM2-135M-Instruct)
    drafter: Path | None = None          # None: the shipped drafter for the default target
    n_ctx: int = 4096
    n_threads: int = 0                   # 0: all cores
    n_batch: int = 512
    n_gpu_layers: int = 0
    fit: bool = False                    # choose n_gpu_layers / n_cpu_moe from free VRAM
    fit_target: int = 768                # MiB --fit leaves free on the device (llama.cpp's --fit-target)
    draft_max: int | None = None         # None: block size - 1
    draft_min: int = 1
    lookup_max: int = 32                 # most prompt-lookup tokens per verify, where the policy finds they pay
    adaptive: bool = True
    draft_confidence: bool = False       # verify only the drafted slots a confidence head rates worth it (DSpark;
                                         # off: no measured gain on SmolLM2/CPU, docs/dflash-family.md)
    draft_trim: bool = False             # DFlash: verify only the drafted slots its own probabilities, calibrated
                                         # online, rate worth their rows (off: no measured gain, docs/draft-trim.md)
    draft_ctx: int | None = None         # drafter KV window; None: the target's n_ctx
    draft_n_gpu_layers: int | None = None
    t_mode: str = "rejection"            # T>0 verification: "rejection" | "match"
    draft_source: str = "hybrid"         # DRAFT_SOURCES
    flash_attn: str = "auto"
    cache_type_k: str = "f16"            # KV_CACHE_TYPES, for the target's KV and the drafter's
    cache_type_v: str = "f16"
    n_cpu_moe: int = 0
    cpu_moe: bool = False
    override_tensor: tuple[str, ...] = ()        # "REGEX=BUFT"
    draft_override_tensor: tuple[str, ...] = ()
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    rpc: str | None = None
    backend: str | None = None           # ggml backend build to load: cpu | cuda | vulkan | metal (None: detected)
    devices: tuple[str, ...] = ()        # target's ggml devices (llama.cpp's --device; "none": CPU only)
    draft_devices: tuple[str, ...] = ()  # the drafter's; () = the target's

    @classmethod
    def from_env(cls, **overrides) -> "EngineSettings":
        """Defaults, then DFLASH_GGUF_<FIELD> environment variables, then explicit overrides (not None)."""
        values = {}
        for f in fields(cls):
            raw = os.environ.get(f"DFLASH_GGUF_{f.name.upper()}")
            if raw is not None:
                try:
                    values[f.name] = _parse(f.type, raw)
                except ValueError:
                    raise UserError(f"DFLASH_GGUF_{f.name.upper()}={raw!r}: not a valid {f.type}; "
                                    "fix or unset the environment variable") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

    def validate(self) -> "EngineSettings":
        """Refuse out-of-range values with the option that sets them (CLI flag / DFLASH_GGUF_* variable)."""
        refuse_first((
            (self.n_ctx >= MIN_CTX, "-c/--ctx-size", self.n_ctx,
             f"must be >= {MIN_CTX} (the engine measures and drafts in blocks of up to {MIN_CTX // 2} tokens)"),
            (self.n_threads >= 0, "-t/--threads", self.n_threads, "must be >= 0 (0 = all cores)"),
            (self.n_batch >= 1, "n_batch", self.n_batch, "must be >= 1"),
            (self.draft_max is None or self.draft_max >= 1, "--draft-max", self.draft_max, "must be >= 1"),
            (self.draft_min >= 1, "--draft-min", self.draft_min, "must be >= 1"),
            (1 <= self.lookup_max <= MIN_CTX // 2 - 1, "--lookup-max", self.lookup_max,
             f"must be 1..{MIN_CTX // 2 - 1}"),
            (self.draft_ctx is None or self.draft_ctx >= 1, "--draft-ctx", self.draft_ctx, "must be >= 1"),
            (self.t_mode in T_MODES, "--t-mode", self.t_mode, f"must be one of {', '.join(T_MODES)}"),
            (self.flash_attn in FLASH_ATTN_MODES, "DFLASH_GGUF_FLASH_ATTN", self.flash_attn,
             f"must be one of {', '.join(FLASH_ATTN_MODES)}"),
            (self.cache_type_k in KV_CACHE_TYPES, "-ctk/--cache-type-k", self.cache_type_k,
             f"must be one of {', '.join(KV_CACHE_TYPES)}"),
            (self.cache_type_v in KV_CACHE_TYPES, "-ctv/--cache-type-v", self.cache_type_v,
             f"must be one of {', '.join(KV_CACHE_TYPES)}"),
            (self.cache_type_v in UNQUANTIZED_KV or self.flash_attn != "off", "-ctv/--cache-type-v",
             self.cache_type_v, "a quantized V cache needs flash attention, which DFLASH_GGUF_FLASH_ATTN=off turns "
             f"off: unset it (auto turns it on) or choose -ctv {' / '.join(UNQUANTIZED_KV)}"),
            (self.draft_source in DRAFT_SOURCES, "--draft-source", self.draft_source,
             f"must be one of {', '.join(DRAFT_SOURCES)}"),
            (self.fit_target >= 0, "--fit-target", self.fit_target, "must be >= 0 (MiB left free on the device)"),
            (self.n_cpu_moe >= 0, "--n-cpu-moe", self.n_cpu_moe, "must be >= 0"),
            (self.main_gpu >= 0, "-mg/--main-gpu", self.main_gpu, "must be >= 0"),
            (self.backend is None or self.backend in BACKENDS, "--backend", self.backend,
             f"must be one of {', '.join(BACKENDS)}"),
            (all(x >= 0 for x in self.tensor_split), "-ts/--tensor-split", ",".join(map(str, self.tensor_split)),
             "must be non-negative proportions, e.g. 3,1"),
        ))
        return self


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


def parse_tensor_split(spec: str | None) -> tuple[float, ...] | None:
    """-ts/--tensor-split "3,1" → (3.0, 1.0)."""
    if not spec:
        return None
    try:
        return tuple(float(x) for x in spec.split(","))
    except ValueError:
        raise UserError(f"-ts/--tensor-split {spec}: give proportions per GPU, e.g. 3,1") from None


def parse_devices(spec: str | None) -> tuple[str, ...] | None:
    """--device "Vulkan0,Vulkan1" → ("Vulkan0", "Vulkan1"); "none" keeps every layer on the CPU."""
    if not spec:
        return None
    names = tuple(x.strip() for x in spec.split(",") if x.strip())
    if "none" in names and len(names) > 1:
        raise UserError(f"--device {spec}: 'none' (CPU only) cannot be combined with devices")
    return names or None
