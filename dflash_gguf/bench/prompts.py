"""Benchmark prompts from JSONL files: `prompt` or `messages` (+ optional `id`, `category`, `format`) per line.

Code prompts (or `"format": "completion"`) are raw completions; the others (chat, math, ...) go through the target's chat template,
exactly as `dflash-gguf run --chat` formats them. `messages` is a whole chat request as a desktop app sends it
(`[{"role": "system", ...}, {"role": "user", ...}]`, OpenAI's shape, the last turn the user's), rendered the way
`serve` renders that request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

@dataclass
class BenchPrompt:
    id: str
    category: str
    text: str              # what the model sees as text (chat prompts rendered through the template)
    tokens: list[int]      # the same, tokenized by the target
    upstream_text: str     # what llama.cpp's tools must read to see `tokens` (they add BOS themselves)


def read_rows(files: list[Path], limit: int | None) -> list[dict]:
    """Rows with id/category/prompt (and `messages` where a row gives a chat request); at most `limit` per
    category, in file order."""
    rows, per_cat = [], {}
    for f in files:
        if not f.is_file():
            raise UserError(f"--prompts {f}: no such file")
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            where = f"--prompts {f}:{i + 1}"
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict) or not ("prompt" in row or "messages" in row):
                raise UserError(f"{where}: expected a JSON object with a 'prompt' or a 'messages' field")
            messages = _messages(row, where) if "messages" in row else None
            text = messages[-1]["content"] if messages else row["prompt"]
            if not isinstance(text, str) or not text:
                raise UserError(f"{where}: 'prompt' must be a non-empty string")
            cat = str(row.get("category") or f.stem)
            if limit is not None and per_cat.get(cat, 0) >= limit:
                continue
            per_cat[cat] = per_cat.get(cat, 0) + 1
            rows.append({"id": str(row.get("id", f"{f.stem}-{i + 1}")), "category": cat, "prompt": text}
                        | ({"format": row["format"]} if "format" in row else {})
                        | ({"messages": messages} if messages else {}))
    if not rows:
        raise UserError(f"--prompts {' '.join(map(str, files))}: no prompts found")
    return rows


CHAT_ROLES = ("system", "user", "assistant")


def _messages(row: dict, where: str) -> list[dict]:
    """A row's chat request, checked: roles from CHAT_ROLES, text contents, the last turn the user's."""
    messages = row["messages"]
    if row.get("prompt") is not None:
        raise UserError(f"{where}: give 'prompt' or 'messages', not both")
    if row.get("format") == "completion":
        raise UserError(f"{where}: 'messages' is a chat request; a completion row gives 'prompt'")
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    for k, m in enumerate(messages):
        if not (isinstance(m, dict) and m.get("role") in CHAT_ROLES and isinstance(m.get("content"), str)
                and m["content"]):
            raise UserError(f"{where}: messages[{k}] must be {{'role': one of {', '.join(CHAT_ROLES)}, "
                            f"'content': a non-empty string}}")
    if messages[-1]["role"] != "user":
        raise UserError(f"{where}: the last of 'messages' must be the user's turn (bench decodes the answer)")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def prepare(rows: list[dict], engine, chat_template: str | None = None) -> list[BenchPrompt]:
    """Chat categories through the model's template (textgen.chat.model_template, or --chat-template); a model
    with none and no built-in that fits reads them raw (a `messages` row: its turns one after the other, a blank
    line between), as before templates had a fallback."""
    import sys  # noqa: PLC0415

    from ..textgen.chat import ChatTemplateError, model_template, render_model_chat  # noqa: PLC0415
    from ..textgen.prompting import chat_messages, is_completion  # noqa: PLC0415
    model = engine.target_model
    try:
        chosen = model_template(model, chat_template)
        template = chosen.text
        if not chosen.is_models_own:
            print(f"chat template: {chosen.source}", file=sys.stderr)
    except ChatTemplateError as e:
        if chat_template:
            raise
        print(f"note: {e}; chat prompts are read raw", file=sys.stderr)
        template = None
    out = []
    for row in rows:
        if template is not None and not is_completion(row):
            text = render_model_chat(model, chat_messages(row), template=template)
            tokens = model.tokenize(text, add_special=False)
        else:   # raw: a completion's prompt, or a chat request's turns one after the other
            text = "\n\n".join(m["content"] for m in chat_messages(row))
            tokens = model.tokenize(text, add_special=True)
        out.append(BenchPrompt(row["id"], row["category"], text, tokens, text_for_tools(model, text, tokens)))
    return out


def text_for_tools(model, text: str, tokens: list[int]) -> str:
    """The text whose tokenization with the model's own special tokens added is `tokens`.

    llama.cpp's tools tokenize a prompt file with BOS added; a template that writes BOS into the text (Gemma,
    Llama 3) would give them two. Returns `text` unchanged when no such text exists (the mismatch is reported)."""
    if model.tokenize(text, add_special=True) == tokens:
        return text
    bos = model.token_bytes(model.bos(), special=True).decode("utf-8", "replace")
    if bos and text.startswith(bos) and model.tokenize(text[len(bos):], add_special=True) == tokens:
        return text[len(bos):]
    return text
