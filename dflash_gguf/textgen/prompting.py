"""Prompt rows as the target reads them: raw completions, or user turns through its chat template."""

from __future__ import annotations


def is_completion(row: dict) -> bool:
    """Rows say `format`; older rows only a category (code prompts were raw completions)."""
    return row.get("format", "completion" if row.get("category") == "code" else "chat") == "completion"


def render(model, messages: list[dict], add_generation_prompt: bool = True) -> str:
    from ..engine.chat import render_chat  # noqa: PLC0415
    special = lambda t: model.token_bytes(t, special=True).decode("utf-8", "replace")  # noqa: E731
    return render_chat(model.chat_template(), messages, bos_token=special(model.bos()), eos_token=special(model.eos()),
                       model_name=model.path.name, add_generation_prompt=add_generation_prompt)


def format_prompt(model, row: dict) -> list[int]:
    """Completion rows are raw text; chat rows go through the model's chat template."""
    if is_completion(row) or not model.chat_template():
        return model.tokenize(row["prompt"], add_special=True)
    return model.tokenize(render(model, [{"role": "user", "content": row["prompt"]}]), add_special=False)


def next_turn_tokens(model, messages: list[dict], eog_token: int) -> list[int] | None:
    """Tokens that follow the assistant's end-of-turn token to open the next user turn (messages[-1]) and
    the next answer, or None where the template does not end a turn with that token."""
    eog = model.token_bytes(eog_token, special=True).decode("utf-8", "replace")
    full = render(model, messages)
    answered = render(model, messages[:-1], add_generation_prompt=False)
    cut = answered.rfind(eog)
    if not eog or cut < 0 or not full.startswith(answered):
        return None
    return model.tokenize(answered[cut + len(eog):] + full[len(answered):], add_special=False)
