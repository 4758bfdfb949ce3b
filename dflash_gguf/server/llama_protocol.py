"""llama-server's native request bodies (`POST /completion`, `/tokenize`, `/detokenize`): what is applied,
what is accepted only at its neutral value, and what llama-server itself would ignore.

llama-server ignores fields it does not know, and front-ends rely on that: SillyTavern's llama.cpp mode sends
one body for every backend it speaks to (`max_new_tokens`, `truncation_length`, `rep_pen`, ... beside
llama-server's own names; SillyTavern public/scripts/textgen-settings.js, createTextGenGenerationData). So
here, unlike the OpenAI routes (protocol.py), a field llama-server does not read is ignored, as there; a field
llama-server reads and would apply is applied (prompt, n_predict/max_tokens, stream, stop, temperature, top_k,
top_p, min_p, seed, cache_prompt, n_probs, return_tokens), or accepted at the value that turns it off
(penalties, DRY, XTC, mirostat, typical_p, grammar, json_schema, logit_bias, ...), or refused with a 400 that
names it. Defaults are llama-server's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, n_predict -1).
`samplers` (the chain's order) is accepted when it lists every active sampler: the order of our one transform
is fixed (engine/sampling.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..engine.sampling import SamplingParams
from .protocol import BadRequest, checked_sampling

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "n_predict": -1, "seed": -1}
MAX_N_PROBS = 100


def _off(*neutral) -> Callable[[Any], bool]:
    return lambda v: v is None or any(v == n and type(v) is not bool or v is n for n in neutral)


def _below(limit: float) -> Callable[[Any], bool]:
    return lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v <= limit)


# llama-server fields that change the output unless at these values: name → (accepts?, what is accepted)
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "repeat_penalty": (_off(1), "1"), "presence_penalty": (_off(0), "0"), "frequency_penalty": (_off(0), "0"),
    "dry_multiplier": (_off(0), "0"), "xtc_probability": (_off(0), "0"), "mirostat": (_off(0), "0"),
    "typical_p": (_off(1), "1"), "tfs_z": (_off(1), "1"), "top_n_sigma": (_below(0), "-1"),
    "dynatemp_range": (_off(0), "0"), "min_keep": (_off(0), "0"), "adaptive_target": (_below(-1e-9), "-1"),
    "ignore_eos": (_off(False), "false"), "grammar": (_off(""), '""'), "json_schema": (_off({}), "{}"),
    "logit_bias": (_off([], {}), "[] or {}"), "n_indent": (_off(0), "0"), "t_max_predict_ms": (_off(0), "0"),
    "n_cmpl": (_off(1), "1"), "n": (_off(1), "1"), "lora": (_off([]), "[]"),
    "post_sampling_probs": (_off(False), "false"), "response_fields": (_off([]), "[]"),
    "id_slot": (_off(-1, 0), "-1 or 0 (one slot)"), "n_cache_reuse": (_off(0), "0"),
}
# llama-server fields that change nothing here: their partner is off (e.g. dry_base without dry_multiplier),
# they only matter when the context overflows (n_keep: we refuse such prompts), or they are speed/reporting
HARMLESS = {"model", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
            "xtc_threshold", "mirostat_tau", "mirostat_eta", "repeat_last_n", "dynatemp_exponent", "n_keep",
            "n_discard", "timings_per_token", "return_progress", "stream_options", "samplers"}
SAMPLER_NAMES = {"top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "temperature": "temperature"}


@dataclass
class NativeCompletion:
    prompt: str | list[int]
    n_predict: int | None                 # None: until the context is full
    stream: bool
    stop: list[str]
    sampling: SamplingParams
    cache_prompt: bool
    n_probs: int
    return_tokens: bool


def parse_completion(body: Any) -> NativeCompletion:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for key, (accepts, supported) in NEUTRAL.items():
        if key in body and not accepts(body[key]):
            raise BadRequest(f"{key}={body[key]!r} is not supported (it would change the output and this server "
                             f"does not implement it); send {supported} or leave it out", key, "unsupported_value")
    prompt = _prompt(body.get("prompt"))
    n_predict = _int(body, "n_predict", _int(body, "max_tokens", DEFAULTS["n_predict"]))
    if n_predict == 0 or n_predict < -1:
        raise BadRequest("n_predict must be -1 (no limit) or >= 1 (0, evaluating the prompt only, is not "
                         "supported)", "n_predict", "invalid_value")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("stop must be a list of strings", "stop", "invalid_value")
    temperature = _number(body, "temperature", DEFAULTS["temperature"])
    seed = _int(body, "seed", DEFAULTS["seed"])
    # llama.cpp reads a negative temperature as greedy and a negative top_k as off
    sampling = checked_sampling(SamplingParams(
        temperature=max(temperature, 0.0), top_k=max(_int(body, "top_k", DEFAULTS["top_k"]), 0),
        top_p=_number(body, "top_p", DEFAULTS["top_p"]), min_p=_number(body, "min_p", DEFAULTS["min_p"]),
        seed=seed if seed >= 0 else None))
    _check_samplers(body.get("samplers"), sampling)
    n_probs = _int(body, "n_probs", 0)
    if not 0 <= n_probs <= MAX_N_PROBS:
        raise BadRequest(f"n_probs must be in [0, {MAX_N_PROBS}]", "n_probs", "invalid_value")
    return NativeCompletion(prompt, None if n_predict == -1 else n_predict, _bool(body, "stream", False), stop,
                            sampling, _bool(body, "cache_prompt", True), n_probs, _bool(body, "return_tokens", False))


def parse_tokenize(body: Any) -> tuple[str, bool, bool, bool]:
    """(content, add_special, parse_special, with_pieces)"""
    if not isinstance(body, dict) or not isinstance(body.get("content"), str):
        raise BadRequest('tokenize needs {"content": "text"}', "content", "invalid_value")
    return (body["content"], _bool(body, "add_special", False), _bool(body, "parse_special", True),
            _bool(body, "with_pieces", False))


def parse_detokenize(body: Any, n_vocab: int) -> list[int]:
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if tokens is None:
        return []
    if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < n_vocab for t in tokens):
        raise BadRequest(f"tokens must be a list of token ids in [0, {n_vocab})", "tokens", "invalid_value")
    return tokens


def _prompt(prompt: Any) -> str | list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                       # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
        return prompt
    raise BadRequest("prompt must be a non-empty string or a list of token ids (several prompts, mixed lists and "
                     "multimodal objects are not supported)", "prompt", "invalid_value")


def _check_samplers(samplers: Any, s: SamplingParams) -> None:
    if samplers is None:
        return
    if isinstance(samplers, str):                # llama-server also takes "top_k;top_p;..."-style strings
        samplers = [x for x in samplers.replace(";", " ").split() if x]
    if not isinstance(samplers, list) or not all(isinstance(x, str) for x in samplers):
        raise BadRequest("samplers must be a list of sampler names", "samplers", "invalid_value")
    active = {"top_k": s.top_k > 0, "top_p": s.top_p < 1, "min_p": s.min_p > 0,
              "temperature": not s.greedy and s.temperature != 1}
    missing = [name for name, on in active.items() if on and name not in samplers]
    if missing:
        raise BadRequest(f"samplers leaves out {', '.join(missing)}, which this request sets: this server always "
                         "applies temperature, top_k, top_p and min_p; set them to their neutral values instead",
                         "samplers", "unsupported_value")


def _number(body: dict, key: str, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"{key} must be a number", key, "invalid_value")
    return float(v)


def _int(body: dict, key: str, default: int) -> int:
    v = _number(body, key, default)
    if not float(v).is_integer():
        raise BadRequest(f"{key} must be an integer", key, "invalid_value")
    return int(v)


def _bool(body: dict, key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"{key} must be true or false", key, "invalid_value")
    return v
