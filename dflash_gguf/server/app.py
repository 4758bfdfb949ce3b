"""The OpenAI-compatible HTTP app (FastAPI) over one EngineWorker.

Routes: GET /v1/models, POST /v1/chat/completions, POST /v1/completions, GET /health (+ /v1/health), and
llama-server's own (llama_api.py): GET /props, /slots, POST /tokenize, /detokenize, /completion, /slots/0.
Errors always have the OpenAI shape {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass

from fastapi import Request  # module level: FastAPI resolves the endpoints' annotations through globals

from ..errors import UserError
from . import llama_api, prepare, protocol
from .chat_output import OutputSplitter
from .responses import Meta, chat_body, chat_stream, collect, error_body, failure, text_body, text_stream
from .worker import EngineWorker


@dataclass
class ServerConfig:
    model_id: str
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ("*",)
    default_max_tokens: int | None = None        # None: until the context is full (llama-server's -1)
    chat_template: str | None = None             # overrides the model's tokenizer.chat_template


def create_app(worker: EngineWorker, config: ServerConfig):
    from fastapi import FastAPI  # noqa: PLC0415
    from fastapi.exceptions import RequestValidationError  # noqa: PLC0415
    from fastapi.middleware.cors import CORSMiddleware  # noqa: PLC0415
    from fastapi.responses import JSONResponse, StreamingResponse  # noqa: PLC0415
    from starlette.exceptions import HTTPException  # noqa: PLC0415

    app = FastAPI(title="dflash-gguf", version="0.1", docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str, etype: str = "invalid_request_error", param=None, code=None):
        return JSONResponse(error_body(message, etype, param, code), status_code=status)

    @app.exception_handler(UserError)
    async def user_error(_request, e: UserError):
        return error(e.http_status, str(e), e.error_type, getattr(e, "param", None), getattr(e, "code", None))

    @app.exception_handler(HTTPException)
    async def http_error(_request, e: HTTPException):
        return error(e.status_code, str(e.detail), "not_found_error" if e.status_code == 404 else
                     "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, e: RequestValidationError):
        return error(400, str(e))

    if config.api_key:
        app.add_middleware(BearerAuth, key=config.api_key)
    # added last = outermost: CORS headers also go on the 401s, so browsers can read them
    app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["*"],
                       allow_headers=["*"])

    def not_ready():
        if worker.status == "ready":
            return None
        message = "Loading model" if worker.status == "loading" else f"the model failed to load: {worker.error}"
        return JSONResponse({"error": {"code": 503, "message": message, "type": "unavailable_error"}},
                            status_code=503)

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        return not_ready() or {"status": "ok"}

    @app.get("/")
    async def index():
        return {"name": "dflash-gguf", "model": config.model_id, "status": worker.status,
                "endpoints": ["/v1/models", "/v1/chat/completions", "/v1/completions", "/health", "/props",
                              "/slots", "/tokenize", "/detokenize", "/completion"]}

    def model_card() -> dict:
        return {"id": config.model_id, "object": "model", "created": 0, "owned_by": "dflash-gguf"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != config.model_id:
            return error(404, f"model {model_id!r} not found; this server serves {config.model_id!r}",
                         "not_found_error", "model", "model_not_found")
        return model_card()

    async def read_json(request: Request):
        raw = await request.body()
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise protocol.BadRequest(f"malformed JSON body: {e}", None, "invalid_json") from e

    async def respond(request, job, splitter, events, final):
        """Submit the job; stream `events` (SSE lines), or once it is done answer `final(result)`."""
        worker.submit(job)
        if events is not None:
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        result, exc = await collect(request, job, splitter)
        if exc is not None:
            status, err = failure(exc)
            return JSONResponse(err, status_code=status)
        if result is None:
            return error(499, "client closed the request", code="client_closed")
        return final(result)

    async def run(request, job, splitter, meta, req, body, stream):
        events = stream(request, job, splitter, meta, req.include_usage) if req.stream else None
        return await respond(request, job, splitter, events, lambda result: body(meta, splitter, result))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req = protocol.parse_chat(await read_json(request))
        if (busy := not_ready()) is not None:
            return busy
        _default_limit(req, config)
        job, splitter = await asyncio.to_thread(prepare.chat_job, worker.engine, req, config.chat_template,
                                                asyncio.get_running_loop())
        return await run(request, job, splitter, Meta(config.model_id, "chat"), req, chat_body, chat_stream)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = protocol.parse_completion(await read_json(request))
        if (busy := not_ready()) is not None:
            return busy
        _default_limit(req, config)
        job = await asyncio.to_thread(prepare.completion_job, worker.engine, req, asyncio.get_running_loop())
        splitter = OutputSplitter(parse_reasoning=False)
        return await run(request, job, splitter, Meta(config.model_id, "text"), req, text_body, text_stream)

    llama_api.register(app, worker, config, read_json, not_ready, error, respond)
    return app


def _default_limit(req: protocol.Generation, config: ServerConfig) -> None:
    if req.max_tokens is None:
        req.max_tokens = config.default_max_tokens


PUBLIC_PATHS = {"/", "/health", "/v1/health"}     # everything else needs the key, as on llama-server


class BearerAuth:
    """Plain ASGI middleware (BaseHTTPMiddleware would wrap `receive` and blur client disconnects)."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and path not in PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                from fastapi.responses import JSONResponse  # noqa: PLC0415
                body = error_body("invalid or missing API key: send `Authorization: Bearer <key>` with the key "
                                  "given to --api-key", "authentication_error", None, "invalid_api_key")
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
