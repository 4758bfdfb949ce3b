"""llama-server's own endpoints, which front-ends call beside the OpenAI ones (SillyTavern's llama.cpp mode,
the llama.cpp web UI, scripts): GET /props, POST /tokenize, /detokenize, /completion (and /completions),
GET /slots, POST /slots/{id}?action=save|restore|erase. Response shapes follow llama.cpp tools/server
(server-task.cpp to_json_non_oaicompat, README "API Endpoints"); request fields: llama_protocol.py.

One slot (id 0): the engine decodes one sequence at a time; the prompt cache keeps others in RAM.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import Request  # module level: FastAPI resolves the endpoints' annotations through globals

from .. import __version__
from .chat_output import OutputSplitter
from .llama_protocol import DEFAULTS, NativeCompletion, parse_completion, parse_detokenize, parse_tokenize
from .prepare import completion_job, served_template
from .protocol import BadRequest, CompletionRequest
from .responses import DraftCounts, failure, job_events, sse
from .worker import Job, timings

SLOT_ACTIONS = ("save", "restore", "erase")


def register(app, worker, config, read_json, not_ready, error, respond) -> None:
    def engine():
        return worker.engine

    @app.get("/props")
    async def props():
        if (busy := not_ready()) is not None:
            return busy
        e = engine()
        return {"default_generation_settings": slot_state(worker, e), "total_slots": 1,
                "model_path": str(e.target_model.path), "model_alias": config.model_id,
                "cache_type_k": e.settings.cache_type_k, "cache_type_v": e.settings.cache_type_v,
                "chat_template": served_template(e, config.chat_template) or "", "chat_template_caps": {},
                "modalities": {"vision": False, "audio": False}, "build_info": build_info(), "is_sleeping": False,
                "learning": learning_state(worker)}

    @app.get("/slots")
    async def slots():
        if (busy := not_ready()) is not None:
            return busy
        return [slot_state(worker, engine())]

    @app.post("/slots/{slot_id}")
    async def slot_action(slot_id: str, request: Request, action: str = ""):
        if (busy := not_ready()) is not None:
            return busy
        if slot_id != "0":
            raise BadRequest(f"no slot {slot_id}: this server has one slot, 0", "id_slot", "invalid_value")
        if action not in SLOT_ACTIONS:
            raise BadRequest(f"action must be one of {', '.join(SLOT_ACTIONS)}", "action", "invalid_value")
        if worker.cache is None:
            return error(501, "this server keeps no prompt cache", "not_supported_error")
        body = await read_json(request) if action != "erase" else {}
        filename = body.get("filename") if isinstance(body, dict) else None
        if action != "erase" and not isinstance(filename, str):
            raise BadRequest(f'action={action} needs {{"filename": "name"}}', "filename", "invalid_value")
        t0 = time.perf_counter()
        if action == "erase":
            n = await worker.call(lambda w: w.cache.erase_slot())
            return {"id_slot": 0, "n_erased": n}
        if action == "save":
            n, size = await worker.call(lambda w: w.cache.save_slot(filename))
            return {"id_slot": 0, "filename": filename, "n_saved": n, "n_written": size,
                    "timings": {"save_ms": round(1000 * (time.perf_counter() - t0), 3)}}
        n, size = await worker.call(lambda w: w.cache.restore_slot(filename))
        return {"id_slot": 0, "filename": filename, "n_restored": n, "n_read": size,
                "timings": {"restore_ms": round(1000 * (time.perf_counter() - t0), 3)}}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        content, add_special, parse_special, with_pieces = parse_tokenize(await read_json(request))
        if (busy := not_ready()) is not None:
            return busy
        m = engine().target_model
        ids = m.tokenize(content, add_special=add_special, parse_special=parse_special)
        if not with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": _piece(m.token_bytes(t, special=True))} for t in ids]}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await read_json(request)
        if (busy := not_ready()) is not None:
            return busy
        m = engine().target_model
        tokens = parse_detokenize(body, m.n_vocab)
        return {"content": b"".join(m.token_bytes(t, special=True) for t in tokens).decode("utf-8", "replace")}

    @app.post("/completion")
    @app.post("/completions")
    async def completion(request: Request):
        req = parse_completion(await read_json(request))
        if (busy := not_ready()) is not None:
            return busy
        e = engine()
        if req.n_probs and req.stream:
            raise BadRequest("n_probs with stream is not supported (the probabilities are read after the "
                             "generation); send stream: false", "n_probs", "unsupported_value")
        if req.n_probs and e.target.recurrent:
            raise BadRequest(f"n_probs is not supported on {e.target_model.path.name}: its recurrent state cannot "
                             "be read again", "n_probs", "unsupported_value")
        oai = CompletionRequest(req.stream, False, req.sampling, req.n_predict, req.stop, req.cache_prompt, req.prompt)
        job = await asyncio.to_thread(completion_job, e, oai, asyncio.get_running_loop())
        job.n_probs = req.n_probs
        native = NativeReply(config.model_id, req, job, e)
        splitter = OutputSplitter(parse_reasoning=False)
        return await respond(request, job, splitter, native.stream(request) if req.stream else None,
                             lambda result: native.final(result, splitter.content))


class NativeReply:
    """The bodies of one /completion request: stream chunks, then the final object."""

    def __init__(self, model_id: str, req: NativeCompletion, job: Job, engine):
        self.model_id, self.req, self.job, self.engine = model_id, req, job, engine
        self.n_predicted = 0

    def chunk(self, content: str, **extra) -> dict:
        return {"index": 0, "content": content, "tokens": [], "stop": False, "id_slot": 0,
                "tokens_predicted": self.n_predicted, "tokens_evaluated": len(self.job.tokens), **extra}

    def final(self, result, content: str) -> dict:
        m = self.engine.target_model
        text = self.job.text
        stop_type = "word" if text.stopped else "eos" if result.finish_reason == "stop" else "limit"
        body = {"index": 0, "content": content, "tokens": result.tokens if self.req.return_tokens else [],
                "id_slot": 0, "stop": True, "model": self.model_id, "tokens_predicted": len(result.tokens),
                "tokens_evaluated": len(self.job.tokens), "generation_settings": params(self.req, self.engine),
                "prompt": m.detokenize(self.job.tokens) if hasattr(m, "detokenize") else "",
                "has_new_line": "\n" in text.text, "truncated": False, "stop_type": stop_type,
                "stopping_word": text.stop_word, "tokens_cached": len(self.job.tokens) + len(result.tokens) - 1,
                "timings": timings(result)}
        if self.job.probs:
            body["completion_probabilities"] = [_probs_json(p, m) for p in self.job.probs]
        return body

    async def stream(self, request):
        counts = DraftCounts()
        splitter = OutputSplitter(parse_reasoning=False)
        async for kind, payload in job_events(request, self.job):
            if kind == "text":
                counts.add(payload)
                self.n_predicted += payload.n_tokens
                d = splitter.feed(payload.text)
                if d.content:
                    yield sse(self.chunk(d.content, **counts.take()))
            elif kind == "done":
                d = splitter.feed("", final=True)
                if d.content:
                    yield sse(self.chunk(d.content, **counts.take()))
                yield sse({**self.final(payload, ""), "content": ""})
            elif kind == "error":
                yield sse(failure(payload)[1])


def params(req: NativeCompletion | None, engine) -> dict:
    """llama-server's generation_settings (the parts that mean something here)."""
    s = req.sampling if req is not None else None
    get = (lambda name, default: getattr(s, name) if s is not None else default)
    seed = get("seed", None)
    return {"n_predict": (req.n_predict or -1) if req else DEFAULTS["n_predict"],
            "seed": 4294967295 if seed is None else seed,
            "temperature": get("temperature", DEFAULTS["temperature"]), "top_k": get("top_k", DEFAULTS["top_k"]),
            "top_p": get("top_p", DEFAULTS["top_p"]), "min_p": get("min_p", DEFAULTS["min_p"]),
            "typical_p": 1.0, "repeat_last_n": 64, "repeat_penalty": 1.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0,
            "stop": req.stop if req else [], "max_tokens": (req.n_predict or -1) if req else -1, "n_keep": 0,
            "ignore_eos": False, "stream": req.stream if req else True, "n_probs": req.n_probs if req else 0,
            "min_keep": 0, "grammar": "", "samplers": ["temperature", "top_k", "top_p", "min_p"],
            "speculative.n_max": getattr(engine, "draft_max", 0), "speculative.n_min": 0,
            "speculative.type": "dflash" if getattr(engine, "drafter", None) is not None else "none",
            "timings_per_token": False, "post_sampling_probs": False, "lora": []}


def slot_state(worker, engine) -> dict:
    job = worker.running
    return {"id": 0, "id_task": worker.n_submitted - 1 if job is not None else -1, "n_ctx": engine.target.n_ctx,
            "speculative": getattr(engine, "drafter", None) is not None, "is_processing": job is not None,
            "params": params(None, engine),
            "n_cached": len(getattr(engine, "held_tokens", [])),
            "next_token": {"has_next_token": job is not None, "has_new_line": False, "n_remain": -1,
                           "n_decoded": 0, "stopping_word": ""}}


def learning_state(worker) -> dict:
    """Whether finished requests are recorded (serve --learn), and where; how many recorded answers the lookup
    drafts from."""
    r = worker.recorder
    if r is None:
        return {"enabled": False}
    cap = r.store.max_bytes
    state = {"enabled": True, "store": str(r.store.root), "max_mb": None if cap is None else round(cap / 2**20, 3)}
    if worker.corpus is not None:
        state["lookup_answers"], state["lookup_tokens"] = len(worker.corpus), worker.corpus.n_tokens
    return state


def build_info() -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415
        llama = version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - informational only
        llama = "unknown"
    return f"dflash-gguf {__version__} (patched llama.cpp of llama-cpp-python {llama})"


def _piece(raw: bytes):
    """llama-server: the piece as a string when it is valid UTF-8, else its bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _probs_json(p, model) -> dict:
    def entry(token: int, logprob: float) -> dict:
        raw = model.token_bytes(token, special=True)
        return {"id": token, "token": raw.decode("utf-8", "replace"), "bytes": list(raw), "logprob": logprob}
    return {**entry(p.token, p.logprob), "top_logprobs": [entry(t, lp) for t, lp in p.top]}
