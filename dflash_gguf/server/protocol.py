"""OpenAI request validation: every parameter is applied, or refused with a 400 that names it.

Three kinds of fields are accepted: the ones we apply (sampling, limits, stop, tools, thinking), the
ones that cannot change the output (`model`: this server has one; `user`), and knobs we accept only at
their no-op value (`n: 1`, penalties of 0, `logprobs: false`, ...). Anything else is a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..engine.sampling import SamplingParams
from ..errors import UserError


class BadRequest(UserError):
    """A 400 with an OpenAI error body; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


def _number_equal(x: float) -> Callable[[Any], bool]:
    return lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == x)


# name → (accepts the value?, what is accepted) for knobs we only take at their no-op value
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (_number_equal(1), "1"),
    "best_of": (_number_equal(1), "1"),
    "presence_penalty": (_number_equal(0), "0"),
    "frequency_penalty": (_number_equal(0), "0"),
    "repeat_penalty": (_number_equal(1), "1"),
    "logprobs": (lambda v: v is None or v is False, "false or null"),
    "top_logprobs": (_number_equal(0), "0 or null"),
    "logit_bias": (lambda v: v is None or v == {}, "{} or null"),
    "echo": (lambda v: v is None or v is False, "false"),
    "suffix": (lambda v: v is None or v == "", "null"),
    "store": (lambda v: v is None or v is False, "false"),
    "response_format": (lambda v: v is None or v == {"type": "text"}, '{"type": "text"}'),
}
HARMLESS = {"model", "user"}
OPENAI_MAX_TEMPERATURE = 2.0          # the OpenAI API's upper bound (the engine has none)
COMMON = HARMLESS | {"stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "max_tokens", "stop",
                     "seed", "cache_prompt"} | set(NEUTRAL) - {"echo", "suffix", "best_of"}
CHAT = COMMON | {"messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
                 "chat_template_kwargs", "reasoning_format"}
COMPLETION = COMMON | {"prompt", "echo", "suffix", "best_of"}


@dataclass
class Generation:
    stream: bool
    include_usage: bool
    sampling: SamplingParams
    max_tokens: int | None              # None: until the context is full
    stop: list[str]
    cache_prompt: bool                  # False: prefill the whole prompt (llama-server's field; output is the same)


@dataclass
class ChatRequest(Generation):
    messages: list[dict]
    tools: list[dict] | None
    enable_thinking: bool | None
    parse_reasoning: bool               # False: thinking stays in `content`, tags included
    parallel_tool_calls: bool


@dataclass
class CompletionRequest(Generation):
    prompt: str | list[int]             # text, or token ids


def parse_chat(body: Any) -> ChatRequest:
    body = _check_fields(body, CHAT)
    gen = _generation(body, chat=True)
    reasoning_format = body.get("reasoning_format")
    if reasoning_format not in (None, "auto", "deepseek", "none"):
        raise BadRequest("reasoning_format must be auto, deepseek or none", "reasoning_format", "invalid_value")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool) and parallel is not None:
        raise BadRequest("parallel_tool_calls must be a boolean", "parallel_tool_calls", "invalid_value")
    return ChatRequest(**gen.__dict__, messages=_messages(body), tools=_tools(body),
                       enable_thinking=_enable_thinking(body), parse_reasoning=reasoning_format != "none",
                       parallel_tool_calls=parallel is not False)


def parse_completion(body: Any) -> CompletionRequest:
    body = _check_fields(body, COMPLETION)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                       # a batch of one
    ok_tokens = isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt)
    if not (isinstance(prompt, str) and prompt) and not ok_tokens:
        raise BadRequest("prompt must be one non-empty string or one list of token ids "
                         "(several prompts per request are not supported)", "prompt", "invalid_value")
    return CompletionRequest(**_generation(body, chat=False).__dict__, prompt=prompt)


def _check_fields(body: Any, allowed: set[str]) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unsupported parameter(s): {', '.join(unknown)} (this server rejects what it does "
                         "not apply; remove them from the request)", unknown[0], "unsupported_parameter")
    for key, (accepts, supported) in NEUTRAL.items():
        if key in body and not accepts(body[key]):
            raise BadRequest(f"unsupported value for {key}: {body[key]!r}; only {supported} is supported",
                             key, "unsupported_value")
    return body


def checked_sampling(sampling: SamplingParams) -> SamplingParams:
    """The request's sampling settings, or a 400 naming the first one outside engine/sampling.py's ranges."""
    found = sampling.problem()
    if found:
        raise BadRequest(found[1], found[0], "invalid_value")
    return sampling


def _number(body: dict, key: str, kind: type, lo=None, hi=None, default=None):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise BadRequest(f"{key} must be {'an integer' if kind is int else 'a number'}", key, "invalid_value")
    v = kind(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadRequest(f"{key} must be in [{lo}, {hi if hi is not None else '∞'}], got {v}", key, "invalid_value")
    return v


def _generation(body: dict, chat: bool) -> Generation:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", "stream", "invalid_value")
    so = body.get("stream_options") or {}
    if not isinstance(so, dict) or set(so) - {"include_usage"}:
        raise BadRequest("stream_options: only include_usage is supported", "stream_options", "unsupported_value")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 16:
        raise BadRequest("stop must be a string or a list of at most 16 strings", "stop", "invalid_value")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, key, int, -1)
    if max_tokens == 0:
        raise BadRequest(f"{key} must be >= 1 (or -1 for no limit)", key, "invalid_value")
    seed = _number(body, "seed", int)
    sampling = checked_sampling(SamplingParams(
        temperature=_number(body, "temperature", float, default=1.0), top_k=_number(body, "top_k", int, default=0),
        top_p=_number(body, "top_p", float, default=1.0), min_p=_number(body, "min_p", float, default=0.0),
        seed=seed if seed is None or seed >= 0 else None))   # -1: random (llama.cpp)
    if sampling.temperature > OPENAI_MAX_TEMPERATURE:
        raise BadRequest(f"temperature {sampling.temperature}: must be in [0, {OPENAI_MAX_TEMPERATURE:g}] (the OpenAI "
                         "API's range)", "temperature", "invalid_value")
    cache_prompt = body.get("cache_prompt", True)
    if not isinstance(cache_prompt, bool) and cache_prompt is not None:
        raise BadRequest("cache_prompt must be a boolean", "cache_prompt", "invalid_value")
    return Generation(stream, bool(so.get("include_usage")), sampling,
                      None if max_tokens in (None, -1) else max_tokens, stop, cache_prompt is not False)


def _text(content: Any, where: str) -> str:
    """OpenAI content: a string, null, or a list of parts of which we take text only."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}: content part of type {kind!r} is not supported (text only)",
                                 "messages", "unsupported_value")
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequest(f"{where}: content must be a string or a list of text parts", "messages", "invalid_value")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list", "messages", "invalid_value")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise BadRequest(f"messages[{i}] needs a role of system, developer, user, assistant or tool",
                             "messages", "invalid_value")
        msg = {**m, "content": _text(m.get("content"), f"messages[{i}]")}
        if msg["role"] == "developer":
            msg["role"] = "system"
        if m.get("tool_calls"):
            msg["tool_calls"] = [_call_for_template(c, i) for c in m["tool_calls"]]
        out.append(msg)
    return out


def _call_for_template(call: Any, i: int) -> dict:
    """Chat templates (Qwen, Hermes, Llama) expect `arguments` as an object, clients send a JSON string."""
    import json  # noqa: PLC0415
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest(f"messages[{i}].tool_calls: each call needs function.name", "messages", "invalid_value")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            pass                                  # not JSON: the template gets the string as it is
    return {**call, "function": {**fn, "arguments": args}}


def _enable_thinking(body: dict) -> bool | None:
    kw = body.get("chat_template_kwargs") or {}
    if not isinstance(kw, dict) or set(kw) - {"enable_thinking"}:
        raise BadRequest("chat_template_kwargs: only enable_thinking is supported", "chat_template_kwargs",
                         "unsupported_value")
    v = kw.get("enable_thinking")
    if v is not None and not isinstance(v, bool):
        raise BadRequest("chat_template_kwargs.enable_thinking must be a boolean", "chat_template_kwargs",
                         "invalid_value")
    return v


def _tools(body: dict) -> list | None:
    t = body.get("tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):     # forcing a call would need constrained decoding
        raise BadRequest("tool_choice: only auto and none are supported", "tool_choice", "unsupported_value")
    if t is None or t == []:
        return None
    if not isinstance(t, list) or not all(isinstance(x, dict) and x.get("type") == "function"
                                          and isinstance(x.get("function"), dict)
                                          and isinstance(x["function"].get("name"), str) for x in t):
        raise BadRequest('tools must be a list of {"type": "function", "function": {"name": ...}}', "tools",
                         "invalid_value")
    return None if choice == "none" else t
