"""Parsed request → prompt tokens → a Job for the engine thread (chat template, context check, limits)."""

from __future__ import annotations

import asyncio

from ..engine.target import ContextOverflow, check_prompt_fits
from ..engine.text import TextStream
from ..textgen.chat import ChatTemplateError, model_template, render_model_chat, supports_thinking
from .chat_output import THINK_OPEN, OutputSplitter
from .protocol import BadRequest, ChatRequest, CompletionRequest, Generation, checked_sampling
from .worker import Job


def served_template(engine, template_override: str | None) -> str | None:
    """The chat template requests are rendered with (GET /props reports it): --chat-template, else the GGUF's own,
    else llama.cpp's built-in for the model (textgen/chat.py); None when the model has none of them."""
    try:
        return template_override or model_template(engine.target_model).text
    except ChatTemplateError:
        return None


def chat_job(engine, req: ChatRequest, template_override: str | None,
             loop: asyncio.AbstractEventLoop) -> tuple[Job, OutputSplitter]:
    m = engine.target_model
    template = served_template(engine, template_override)
    if not template:
        raise BadRequest(f"{m.path.name} has no chat template and no llama.cpp built-in fits it: use /v1/completions "
                         "with a raw prompt, or start the server with --chat-template NAME|FILE", "messages",
                         "no_chat_template")
    if req.tools and "tools" not in template:
        raise BadRequest(f"{m.path.name}'s chat template has no tool support, so the tools would be ignored; "
                         "remove `tools` or serve a model whose template renders them", "tools", "unsupported_value")
    think = req.enable_thinking
    if not supports_thinking(template):
        if think:
            raise BadRequest(f"{m.path.name}'s chat template has no thinking switch "
                             "(chat_template_kwargs.enable_thinking)", "chat_template_kwargs", "unsupported_value")
        think = None          # false on a model that cannot think is already true to the request
    text = render_model_chat(m, req.messages, template=template, tools=req.tools, enable_thinking=think)
    opened_think = text.rstrip().endswith(THINK_OPEN)   # R1-style templates open the think block themselves
    splitter = OutputSplitter(thinking=opened_think, parse_reasoning=req.parse_reasoning, tools=bool(req.tools),
                              max_tool_calls=None if req.parallel_tool_calls else 1)
    job = _job(engine, m.tokenize(text, add_special=False), req, "messages", loop)
    job.template = template
    return job, splitter


def completion_job(engine, req: CompletionRequest, loop: asyncio.AbstractEventLoop) -> Job:
    if isinstance(req.prompt, str):
        tokens = engine.tokenize(req.prompt, add_special=True)
    else:
        n_vocab = engine.target_model.n_vocab
        bad = [t for t in req.prompt if t >= n_vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the vocabulary ({n_vocab})", "prompt", "invalid_value")
        tokens = list(req.prompt)
    return _job(engine, tokens, req, "prompt", loop)


def _job(engine, tokens: list[int], req: Generation, param: str, loop) -> Job:
    n_ctx = engine.target.n_ctx
    if not tokens:
        raise BadRequest("the prompt is empty after tokenization", param, "invalid_value")
    try:
        check_prompt_fits(len(tokens), n_ctx, req.max_tokens or 1)
    except ContextOverflow as e:
        raise BadRequest(str(e), param, "context_length_exceeded") from None
    room = n_ctx - len(tokens)
    max_tokens = min(req.max_tokens or room, room)
    text = TextStream(engine.target_model.token_bytes, req.stop)
    return Job(tokens, max_tokens, checked_sampling(req.sampling), text, loop, cache_prompt=req.cache_prompt)
