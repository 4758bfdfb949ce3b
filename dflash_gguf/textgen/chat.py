"""Chat templates from GGUF metadata, rendered with jinja2 the way HF tokenizers do."""

from __future__ import annotations

import datetime
from typing import Any, Sequence

from ..errors import UserError


class ChatTemplateError(UserError):
    """The model has no usable chat template, or rendering failed."""


def _raise(message: str):
    raise ChatTemplateError(f"chat template: {message}")


def render_chat(template: str | None, messages: Sequence[dict[str, Any]], *, bos_token: str = "",
                eos_token: str = "", add_generation_prompt: bool = True, enable_thinking: bool | None = None,
                tools: list | None = None, model_name: str = "model") -> str:
    if not template:
        raise ChatTemplateError(f"{model_name} has no chat template (tokenizer.chat_template); "
                                "use a raw prompt (-p without --chat) or a model with a template")
    import jinja2  # noqa: PLC0415
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    kwargs: dict[str, Any] = {"messages": list(messages), "bos_token": bos_token, "eos_token": eos_token,
                              "add_generation_prompt": add_generation_prompt}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    if tools:
        kwargs["tools"] = tools
    try:
        return env.from_string(template).render(**kwargs)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"{model_name}: rendering the chat template failed: {e}") from e


def render_model_chat(model, messages: Sequence[dict[str, Any]], *, template: str | None = None,
                      add_generation_prompt: bool = True, enable_thinking: bool | None = None,
                      tools: list | None = None) -> str:
    """`messages` through `template` (default: the model's own), with the model's BOS/EOS text."""
    special = lambda t: model.token_bytes(t, special=True).decode("utf-8", "replace")  # noqa: E731
    return render_chat(template or model.chat_template(), messages, bos_token=special(model.bos()),
                       eos_token=special(model.eos()), add_generation_prompt=add_generation_prompt,
                       enable_thinking=enable_thinking, tools=tools, model_name=model.path.name)


def supports_thinking(template: str | None) -> bool:
    return bool(template) and "enable_thinking" in template


def _tojson(value, indent=None, ensure_ascii=False, **_):
    import json  # noqa: PLC0415
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)
