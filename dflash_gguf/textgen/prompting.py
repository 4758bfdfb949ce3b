"""Prompt rows as the target reads them: raw completions, or chat requests through its chat template."""

from __future__ import annotations

from .chat import render_model_chat


def is_completion(row: dict) -> bool:
    """Rows say `format`; older rows only a category (code prompts were raw completions); a row with chat
    `messages` is a chat request."""
    if "messages" in row:
        return False
    return row.get("format", "completion" if row.get("category") == "code" else "chat") == "completion"


def chat_messages(row: dict) -> list[dict]:
    """A chat row's request: its `messages` (a system prompt and earlier turns), or its prompt as one user turn."""
    return row.get("messages") or [{"role": "user", "content": row["prompt"]}]


def format_prompt(model, row: dict, template: str | None = None) -> list[int]:
    """Completion rows are raw text; chat rows go through `template` (default: the model's, as
    textgen.chat.model_template picks it), exactly as run --chat and serve render them."""
    if is_completion(row):
        return model.tokenize(row["prompt"], add_special=True)
    text = render_model_chat(model, chat_messages(row), template=template)
    return model.tokenize(text, add_special=False)


def next_turn_tokens(model, messages: list[dict], eog_token: int, template: str | None = None) -> list[int] | None:
    """Tokens that follow the assistant's end-of-turn token to open the next user turn (messages[-1]) and
    the next answer, or None where the template does not end a turn with that token."""
    eog = model.token_bytes(eog_token, special=True).decode("utf-8", "replace")
    full = render_model_chat(model, messages, template=template)
    answered = render_model_chat(model, messages[:-1], add_generation_prompt=False, template=template)
    cut = answered.rfind(eog)
    if not eog or cut < 0 or not full.startswith(answered):
        return None
    return model.tokenize(answered[cut + len(eog):] + full[len(answered):], add_special=False)
