"""Benchmark prompts from JSONL files: `prompt` (+ optional `id`, `category`, `format`) per line.

Code prompts (or `"format": "completion"`) are raw completions; the others (chat, math, ...) go through the target's chat template,
exactly as `dflash-gguf run --chat` formats them.
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
    """Rows with id/category/prompt; at most `limit` per category, in file order."""
    rows, per_cat = [], {}
    for f in files:
        if not f.is_file():
            raise UserError(f"--prompts {f}: no such file")
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row["prompt"]
            except (ValueError, KeyError, TypeError):
                raise UserError(f"--prompts {f}:{i + 1}: expected a JSON object with a 'prompt' field") from None
            if not isinstance(text, str) or not text:
                raise UserError(f"--prompts {f}:{i + 1}: 'prompt' must be a non-empty string")
            cat = str(row.get("category") or f.stem)
            if limit is not None and per_cat.get(cat, 0) >= limit:
                continue
            per_cat[cat] = per_cat.get(cat, 0) + 1
            rows.append({"id": str(row.get("id", f"{f.stem}-{i + 1}")), "category": cat, "prompt": text}
                        | ({"format": row["format"]} if "format" in row else {}))
    if not rows:
        raise UserError(f"--prompts {' '.join(map(str, files))}: no prompts found")
    return rows


def prepare(rows: list[dict], engine, chat_template: str | None = None) -> list[BenchPrompt]:
    """Chat categories through the model's template (textgen.chat.model_template, or --chat-template); a model
    with none and no built-in that fits reads them raw, as before templates had a fallback."""
    import sys  # noqa: PLC0415

    from ..textgen.chat import ChatTemplateError, model_template, render_model_chat  # noqa: PLC0415
    from ..textgen.prompting import is_completion  # noqa: PLC0415
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
        text = row["prompt"]
        if template is not None and not is_completion(row):
            text = render_model_chat(model, [{"role": "user", "content": text}], template=template)
            tokens = model.tokenize(text, add_special=False)
        else:
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
