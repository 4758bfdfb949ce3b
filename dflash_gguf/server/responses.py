"""Job events → OpenAI response bodies and SSE streams (chat.completion[.chunk], text_completion)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from ..engine.loop import GenerationResult
from ..errors import UserError
from .chat_output import OutputSplitter
from .worker import END_EVENTS, Job, Piece, timings

DISCONNECT_POLL_S = 0.5     # how often a waiting request checks that its client is still there


@dataclass
class Meta:
    model: str
    kind: str                                     # "chat" | "text"
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = self.id or f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


async def job_events(request, job: Job) -> AsyncIterator[tuple[str, object]]:
    """The job's events until its end; cancels the job as soon as the client disconnects."""
    try:
        while True:
            try:
                kind, payload = await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return
                continue
            yield kind, payload
            if kind in END_EVENTS:
                return
    finally:
        job.cancel()        # a no-op once the job has ended; stops it at its next step otherwise


def usage(result: GenerationResult) -> dict:
    n = len(result.tokens)
    return {"prompt_tokens": result.n_prompt, "completion_tokens": n, "total_tokens": result.n_prompt + n,
            "prompt_tokens_details": {"cached_tokens": result.n_cached}}


class DraftCounts:
    """Per-chunk `dflash: {tokens, drafted}`: how many tokens a streamed chunk's text came from and how many
    of those were drafts the target accepted (what LM Studio's fragmentGenerated takes as tokenCount and
    containsDrafted). Pieces whose text the splitter holds back add to the next chunk sent."""

    def __init__(self):
        self.tokens = self.drafted = 0

    def add(self, piece: Piece) -> None:
        self.tokens += piece.n_tokens
        self.drafted += piece.n_drafted

    def take(self) -> dict:
        out = {"dflash": {"tokens": self.tokens, "drafted": self.drafted}}
        self.tokens = self.drafted = 0
        return out


def error_body(message: str, etype: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


def failure(exc: BaseException) -> tuple[int, dict]:
    """A generation error → (HTTP status, OpenAI error body)."""
    if isinstance(exc, UserError):
        return exc.http_status, error_body(str(exc), exc.error_type, getattr(exc, "param", None),
                                           getattr(exc, "code", None))
    return 500, error_body(f"generation failed: {type(exc).__name__}: {exc}", "server_error")


async def collect(request, job: Job, splitter: OutputSplitter):
    """Run a non-streaming job: (result, None), (None, exception), or (None, None) if the client left."""
    async for kind, payload in job_events(request, job):
        if kind == "text":
            splitter.feed(payload.text)
        elif kind == "done":
            splitter.feed("", final=True)
            return payload, None
        elif kind == "error":
            return None, payload
    return None, None


def chat_body(meta: Meta, splitter: OutputSplitter, result: GenerationResult) -> dict:
    msg = {"role": "assistant", "content": splitter.content if splitter.content or not splitter.tool_calls else None}
    if splitter.reasoning:
        msg["reasoning_content"] = splitter.reasoning
    if splitter.tool_calls:
        msg["tool_calls"] = splitter.tool_calls
    return {**meta.head("chat.completion"),
            "choices": [{"index": 0, "message": msg, "logprobs": None,
                         "finish_reason": "tool_calls" if splitter.tool_calls else result.finish_reason}],
            "usage": usage(result), "timings": timings(result)}


def text_body(meta: Meta, splitter: OutputSplitter, result: GenerationResult) -> dict:
    return {**meta.head("text_completion"),
            "choices": [{"index": 0, "text": splitter.content, "logprobs": None,
                         "finish_reason": result.finish_reason}],
            "usage": usage(result), "timings": timings(result)}


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


async def chat_stream(request, job: Job, splitter: OutputSplitter, meta: Meta, include_usage: bool):
    """First a role delta, then reasoning/content/tool-call deltas (each with its draft counts), one chunk with
    finish_reason and timings, a usage chunk when asked, then [DONE]."""
    counts = DraftCounts()

    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        return sse({**meta.head("chat.completion.chunk"),
                     "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra})

    def deltas(d) -> list[str]:
        parts = [{"reasoning_content": d.reasoning}] if d.reasoning else []
        parts += [{"content": d.content}] if d.content else []
        parts += [{"tool_calls": [{"index": splitter.tool_calls.index(call), **call}]} for call in d.tool_calls]
        return [chunk(p, **(counts.take() if i == 0 else {})) for i, p in enumerate(parts)]

    yield chunk({"role": "assistant", "content": ""})
    async for kind, payload in job_events(request, job):
        if kind == "text":
            counts.add(payload)
            for line in deltas(splitter.feed(payload.text)):
                yield line
        elif kind == "done":
            for line in deltas(splitter.feed("", final=True)):
                yield line
            finish = "tool_calls" if splitter.tool_calls else payload.finish_reason
            yield chunk({}, finish, timings=timings(payload))
            if include_usage:
                yield sse({**meta.head("chat.completion.chunk"), "choices": [], "usage": usage(payload)})
            yield DONE
        elif kind == "error":
            yield sse(failure(payload)[1])
            yield DONE


async def text_stream(request, job: Job, splitter: OutputSplitter, meta: Meta, include_usage: bool):
    counts = DraftCounts()

    def chunk(text: str, finish: str | None = None, **extra) -> str:
        return sse({**meta.head("text_completion"),
                     "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], **extra})

    async for kind, payload in job_events(request, job):
        if kind == "text":
            counts.add(payload)
        if kind in ("text", "done"):
            d = splitter.feed(payload.text if kind == "text" else "", final=kind == "done")
            if d.content:
                yield chunk(d.content, **counts.take())
        if kind == "done":
            yield chunk("", payload.finish_reason, timings=timings(payload))
            if include_usage:
                yield sse({**meta.head("text_completion"), "choices": [], "usage": usage(payload)})
            yield DONE
        elif kind == "error":
            yield sse(failure(payload)[1])
            yield DONE
