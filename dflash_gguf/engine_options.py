"""The engine's command-line options, declared once: `run`, `serve` and `bench` take all of them.

Every option defaults to None, so that an option left out keeps the DFLASH_GGUF_<FIELD> environment variable
or the EngineSettings default (shown in the help); a given option overrides both.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

import typer

from .settings import EngineSettings, parse_devices, parse_tensor_split


@dataclass(frozen=True)
class EngineOption:
    param: str                  # the command's parameter; the EngineSettings field unless `to_settings` says else
    flags: tuple[str, ...]
    type: Any                   # int | str | bool (a switch) | list[str] (repeatable)
    help: str


ENGINE_OPTIONS = (
    EngineOption("n_ctx", ("-c", "--ctx-size"), int, "context size"),
    EngineOption("n_threads", ("-t", "--threads"), int, "CPU threads (0 = all)"),
    EngineOption("n_gpu_layers", ("-ngl", "--n-gpu-layers"), int, "target layers on the GPU"),
    EngineOption("draft_n_gpu_layers", ("-ngld", "--n-gpu-layers-draft"), int,
                 "drafter layers on the GPU (default: -ngl)"),
    EngineOption("fit", ("--fit",), bool, "choose -ngl / --n-cpu-moe from free VRAM (drafter + KV counted)"),
    EngineOption("fit_target", ("--fit-target",), int, "MiB of device memory --fit leaves free"),
    EngineOption("draft_max", ("--draft-max",), int, "most draft tokens per verify (default: block size - 1)"),
    EngineOption("draft_min", ("--draft-min",), int, "fewest draft tokens per verify"),
    EngineOption("lookup_max", ("--lookup-max",), int,
                 "most prompt-lookup tokens per verify, taken where the policy finds they pay (default 32)"),
    EngineOption("no_adaptive", ("--no-adaptive",), bool, "always verify --draft-max tokens"),
    EngineOption("draft_confidence", ("--draft-confidence",), bool,
                 "with a DSpark confidence head: verify only the drafted slots it rates worth their rows"),
    EngineOption("draft_trim", ("--draft-trim",), bool,
                 "DFlash: verify only the drafted slots the drafter's own probabilities, calibrated as it runs, "
                 "rate worth their rows"),
    EngineOption("draft_ctx", ("--draft-ctx",), int, "drafter KV size (default: --ctx-size)"),
    EngineOption("n_cpu_moe", ("--n-cpu-moe",), int, "keep the MoE experts of the first N layers on CPU"),
    EngineOption("cpu_moe", ("--cpu-moe",), bool, "keep all MoE experts on CPU"),
    EngineOption("override_tensor", ("-ot", "--override-tensor"), list[str], "REGEX=BUFFER_TYPE (repeatable)"),
    EngineOption("cache_type_k", ("-ctk", "--cache-type-k"), str,
                 "KV cache type of K, target and drafter: f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | iq4_nl | q5_0 | q5_1"),
    EngineOption("cache_type_v", ("-ctv", "--cache-type-v"), str,
                 "KV cache type of V, the same types (a quantized one needs flash attention)"),
    EngineOption("t_mode", ("--t-mode",), str, "T>0 verification: rejection | match"),
    EngineOption("draft_source", ("--draft-source",), str,
                 "dflash (the drafter) | lookup (prompt lookup, no drafter file) | hybrid (both, per step)"),
    EngineOption("main_gpu", ("-mg", "--main-gpu"), int, "GPU for the whole model when not split"),
    EngineOption("tensor_split", ("-ts", "--tensor-split"), str, "proportions per GPU, e.g. 3,1"),
    EngineOption("rpc", ("--rpc",), str, "HOST:PORT,... of ggml rpc-servers"),
    EngineOption("backend", ("--backend",), str,
                 "ggml backend build to load: cpu | cuda | vulkan | metal (default: detected)"),
    EngineOption("devices", ("-dev", "--device"), str,
                 "comma-separated ggml devices for the layers, e.g. Vulkan0 (none = CPU only)"),
)

_DEFAULTS = {f.name: f.default for f in fields(EngineSettings)}


def settings_overrides(values: dict[str, Any]) -> dict[str, Any]:
    """The options as EngineSettings overrides; an option not given is None (EngineSettings.from_env skips it)."""
    out = {o.param: values[o.param] for o in ENGINE_OPTIONS if o.type in (int, str)}
    out["fit"] = values["fit"] or None
    out["cpu_moe"] = values["cpu_moe"] or None
    out["adaptive"] = False if values["no_adaptive"] else None
    out["draft_confidence"] = values["draft_confidence"] or None
    out["draft_trim"] = values["draft_trim"] or None
    out["override_tensor"] = tuple(values["override_tensor"]) or None
    out["tensor_split"] = parse_tensor_split(values["tensor_split"])
    out["devices"] = parse_devices(values["devices"])
    return out


def with_engine_options(command: Callable) -> Callable:
    """Adds ENGINE_OPTIONS to a typer command, which receives them as `engine_options`: EngineSettings overrides."""
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "engine_options"]
    added = [inspect.Parameter(o.param, inspect.Parameter.KEYWORD_ONLY, default=_typer_option(o),
                               annotation=_annotation(o)) for o in ENGINE_OPTIONS]

    @functools.wraps(command)
    def wrapper(**kwargs):
        values = {o.param: kwargs.pop(o.param) for o in ENGINE_OPTIONS}
        return command(**kwargs, engine_options=settings_overrides(values))

    wrapper.__signature__ = inspect.Signature(own + added)
    return wrapper


def _annotation(option: EngineOption):
    if option.type is bool:
        return bool
    if option.type == list[str]:
        return list[str]
    return Optional[option.type]


def _typer_option(option: EngineOption):
    default = _DEFAULTS.get(option.param)
    help_text = option.help
    if option.type in (int, str) and default is not None:
        help_text += f" (default: {default})"
    if option.type is bool:
        return typer.Option(False, *option.flags, help=help_text)
    if option.type == list[str]:
        return typer.Option([], *option.flags, help=help_text)
    return typer.Option(None, *option.flags, help=help_text)


def chat_template_option():
    """--chat-template NAME|FILE, one definition for run, serve, bench and train (textgen.chat.read_choice)."""
    from .textgen.chat import CHAT_TEMPLATE_HELP  # noqa: PLC0415
    return typer.Option(None, "--chat-template", help=CHAT_TEMPLATE_HELP)


def learn_option():
    """--learn FOLDER, one definition for run and serve (learn/store.py)."""
    return typer.Option(None, "--learn", help="record each finished request's prompt and answer token ids in this "
                        "folder, for `train --adapt` (local only; off unless given)")


def learn_max_mb_option():
    return typer.Option(256.0, "--learn-max-mb", help="most MB the --learn folder may hold (oldest requests out first)")
