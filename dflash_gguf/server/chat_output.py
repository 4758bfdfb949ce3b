"""Model text → OpenAI message parts: a leading <think>…</think> span to `reasoning_content`, Hermes /
Qwen `<tool_call>{json}</tool_call>` blocks to `tool_calls`, the rest to `content`.

Text arrives in pieces that may cut a tag anywhere, so a tail that could still become a tag is held
back until the next piece (or the end) decides it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class Delta:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)      # calls completed by this piece


@dataclass
class OutputSplitter:
    """`feed(text)` returns what is now safe to show; `feed("", final=True)` flushes the rest."""
    thinking: bool = False            # the prompt already opened <think> (generation starts inside it)
    parse_reasoning: bool = True      # False: thinking text stays in content, tags included
    tools: bool = False               # parse tool-call blocks (only when the request passed tools)
    max_tool_calls: int | None = None  # 1 when parallel_tool_calls is false
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    _buf: str = ""
    _tool: str | None = None          # text of an open tool-call block, None outside one
    _strip: bool = False              # drop the whitespace that follows a think tag

    def __post_init__(self):
        if self.thinking and not self.parse_reasoning:
            self._buf, self.thinking = THINK_OPEN, False      # show the tag the template opened
        self._strip = self.thinking

    def feed(self, text: str, final: bool = False) -> Delta:
        self._buf += text
        out = Delta()
        while self._buf:
            tags = self._watched()
            hits = [(self._buf.find(t), t) for t in tags if t in self._buf]
            if hits and min(hits)[1] == THINK_OPEN and self._buf[:min(hits)[0]].strip():
                tags.remove(THINK_OPEN)          # text came first: this <think> is just text
                hits = [h for h in hits if h[1] != THINK_OPEN]
            if not hits:
                hold = 0 if final else _partial_tag_tail(self._buf, tags)
                self._emit(out, self._buf[:len(self._buf) - hold])
                self._buf = self._buf[len(self._buf) - hold:]
                break
            i, tag = min(hits)
            self._emit(out, self._buf[:i])
            self._buf = self._buf[i + len(tag):]
            if tag in (THINK_OPEN, THINK_CLOSE):
                self.thinking, self._strip = tag == THINK_OPEN, True
            elif tag == TOOL_OPEN:
                self._tool = ""
            else:
                self._close_tool(out, self._tool or "")
        if final and self._tool is not None:    # the model stopped inside a block: parse what came
            self._close_tool(out, self._tool)
        return out

    def _watched(self) -> list[str]:
        if self._tool is not None:
            return [TOOL_CLOSE]
        if self.thinking:
            return [THINK_CLOSE]
        tags = [TOOL_OPEN] if self.tools else []
        if self.parse_reasoning and not self.content.strip() and not self.reasoning:
            tags.append(THINK_OPEN)             # only a leading think block is reasoning
        return tags

    def _emit(self, out: Delta, text: str) -> None:
        if not text:
            return
        if self._tool is not None:
            self._tool += text
            return
        if self._strip:
            text = text.lstrip()
            if not text:
                return
            self._strip = False
        if self.thinking:
            out.reasoning += text
            self.reasoning += text
        else:
            out.content += text
            self.content += text

    def _close_tool(self, out: Delta, raw: str) -> None:
        self._tool = None
        call = parse_tool_call(raw)
        if call is None:                        # not a call after all: keep the text the model wrote
            self._emit(out, f"{TOOL_OPEN}{raw}{TOOL_CLOSE}")
            return
        if self.max_tool_calls is not None and len(self.tool_calls) >= self.max_tool_calls:
            return
        self.tool_calls.append(call)
        out.tool_calls.append(call)


def parse_tool_call(raw: str) -> dict | None:
    """`{"name": ..., "arguments": {...}}` (or "parameters") → an OpenAI tool call, None if it is not one."""
    try:
        obj = json.loads(raw.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}


def _partial_tag_tail(text: str, tags: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `tags`."""
    return max((k for t in tags for k in range(1, len(t)) if text.endswith(t[:k])), default=0)
