"""Chat templates from GGUF metadata, rendered with jinja2 the way HF tokenizers do."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
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


@dataclass(frozen=True)
class ChatTemplate:
    text: str
    source: str                 # where it came from, as told to the user

    @property
    def is_models_own(self) -> bool:
        """The GGUF's own template (commands mention the template only when it is not)."""
        return self.source == GGUF_OWN


GGUF_OWN = "the GGUF's tokenizer.chat_template"


CHAT_TEMPLATE_HELP = ("chat template: a built-in name (chatml, gemma, llama3, phi3, mistral-v7) or a .jinja file "
                      "(default: the GGUF's tokenizer.chat_template, else the built-in for its architecture)")


def read_choice(choice: str | None) -> ChatTemplate | None:
    """--chat-template NAME|FILE as a template (None: not given). Checked before any model loads."""
    from .builtin_templates import BUILTINS  # noqa: PLC0415
    if not choice:
        return None
    if choice in BUILTINS:
        return ChatTemplate(BUILTINS[choice].jinja, f"built-in {choice} (--chat-template)")
    path = Path(choice)
    if not path.is_file():
        raise ChatTemplateError(f"--chat-template {choice}: neither a built-in name ({', '.join(BUILTINS)}) "
                                "nor a file; give one of those names or a .jinja file")
    return ChatTemplate(path.read_text(encoding="utf-8", errors="replace"), f"file {path.name} (--chat-template)")


def model_template(model, choice: str | ChatTemplate | None = None) -> ChatTemplate:
    """The template a model's chats go through: --chat-template when given, else the GGUF's own, else the
    llama.cpp built-in for its architecture or vocabulary (builtin_templates.py). Refuses a model with none."""
    from .builtin_templates import detect  # noqa: PLC0415
    given = read_choice(choice) if isinstance(choice, str) else choice
    if given is not None:
        return given
    own = model.chat_template()
    if own:
        return ChatTemplate(own, GGUF_OWN)
    builtin = detect(model)
    if builtin is None:
        raise ChatTemplateError(f"{model.path.name} has no chat template (tokenizer.chat_template) and no "
                                "llama.cpp built-in template fits its architecture or vocabulary; pass "
                                "--chat-template NAME|FILE or use raw prompts")
    return ChatTemplate(builtin.jinja, f"llama.cpp's built-in {builtin.name} (the GGUF has none; "
                                       f"architecture {model.arch})")


def render_model_chat(model, messages: Sequence[dict[str, Any]], *, template: str | None = None,
                      add_generation_prompt: bool = True, enable_thinking: bool | None = None,
                      tools: list | None = None) -> str:
    """`messages` through `template` (default: model_template's), with the model's BOS/EOS text."""
    special = lambda t: model.token_bytes(t, special=True).decode("utf-8", "replace")  # noqa: E731
    return render_chat(template or model_template(model).text, messages, bos_token=special(model.bos()),
                       eos_token=special(model.eos()), add_generation_prompt=add_generation_prompt,
                       enable_thinking=enable_thinking, tools=tools, model_name=model.path.name)


def supports_thinking(template: str | None) -> bool:
    return bool(template) and "enable_thinking" in template


def _tojson(value, indent=None, ensure_ascii=False, **_):
    import json  # noqa: PLC0415
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)
