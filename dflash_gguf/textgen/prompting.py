"""Prompt rows as the target reads them: raw completions, or user turns through its chat template."""

from __future__ import annotations

from .chat import render_model_chat


def is_completion(row: dict) -> bool:
    """Rows say `format`; older rows only a category (code prompts were raw completions)."""
    return row.get("format", "completion" if row.get("category") == "code" else "chat") == "completion"


def format_prompt(model, row: dict) -> list[int]:
    """Completion rows are raw text; chat rows go through the model's chat template."""
    if is_completion(row) or not model.chat_template():
        return model.tokenize(row["prompt"], add_special=True)
    return model.tokenize(render_model_chat(model, [{"role": "user", "content": row["prompt"]}]), add_special=False)


def next_turn_tokens(model, messages: list[dict], eog_token: int) -> list[int] | None:
    """Tokens that follow the assistant's end-of-turn token to open the next user turn (messages[-1]) and
    the next answer, or None where the template does not end a turn with that token."""
    eog = model.token_bytes(eog_token, special=True).decode("utf-8", "replace")
    full = render_model_chat(model, messages)
    answered = render_model_chat(model, messages[:-1], add_generation_prompt=False)
    cut = answered.rfind(eog)
    if not eog or cut < 0 or not full.startswith(answered):
        return None
    return model.tokenize(answered[cut + len(eog):] + full[len(answered):], add_special=False)
