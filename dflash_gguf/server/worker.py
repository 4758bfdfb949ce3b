"""One thread owns the Engine; requests queue up and run one at a time, never sharing state.

An Engine holds one sequence (target KV + drafter KV), so jobs are strictly sequential; what a job leaves
in it is the prompt cache's (prompt_cache.py) to reuse. Each job carries its own asyncio queue: the engine
thread hands it text pieces and the final result through `loop.call_soon_threadsafe`, and the engine's
token callback returns False as soon as the job is cancelled (client gone), which ends that generation at
its next step and frees the engine. `call` runs anything else that touches the engine (slot files) between
jobs, in the same thread.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..engine.loop import GenerationResult
from ..engine.sampling import SamplingParams
from ..engine.text import TextStream
from .prompt_cache import CacheSettings, PromptCache

END_EVENTS = ("done", "error", "cancelled")


@dataclass
class Job:
    tokens: list[int]
    max_tokens: int
    sampling: SamplingParams
    text: TextStream                      # tokens → text deltas, with the request's stop strings
    loop: asyncio.AbstractEventLoop       # the server's loop, where `events` is read
    events: asyncio.Queue = field(default_factory=asyncio.Queue)   # (kind, payload), kind in text|done|error|cancelled
    cancelled: threading.Event = field(default_factory=threading.Event)
    cache_prompt: bool = True             # False: a cold start (the request's `cache_prompt`)
    n_probs: int = 0                      # > 0: the target's top-n probabilities of each token (llama-server)
    probs: list | None = None             # set by the engine thread before "done": engine.token_probs' result
    template: str | None = None           # the chat template the prompt was rendered with (None: raw completion)

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, kind: str, payload: object = None) -> None:
        """Called from the engine thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:              # the loop is closed: the server is shutting down
            pass


@dataclass
class Piece:
    """A text delta and the tokens it came from: `n_drafted` of them were drafts the target accepted
    (a step's last token is always the target's own)."""
    text: str
    n_tokens: int
    n_drafted: int


@dataclass
class EngineCall:
    """`fn(worker)` run in the engine thread between jobs; its result (or exception) lands in `future`."""
    fn: Callable[["EngineWorker"], object]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


@dataclass
class JobRecord:
    """What happened to a job, kept for /health-style introspection and tests."""
    n_prompt: int
    max_tokens: int
    n_generated: int
    outcome: str                          # done | cancelled | failed
    n_cached: int = 0
    queued_s: float = 0.0
    run_s: float = 0.0


class EngineWorker:
    """States: loading → ready (or failed). `submit` hands a job to the engine thread."""

    def __init__(self, make_engine: Callable[[], object], log: Callable[[str], None] | None = None,
                 cache: CacheSettings | None = None, recorder=None, corpus=None):
        """recorder: a learn.store.Recorder that keeps each finished request (serve --learn), or None; corpus:
        the engine's index of recorded answers (engine/sources/corpus.py), which each finished answer joins."""
        self._make_engine = make_engine
        self.recorder, self.corpus = recorder, corpus
        self._log = log or (lambda msg: None)
        self.engine = None
        self.cache: PromptCache | None = None
        self._cache_settings = cache or CacheSettings()
        self.running: Job | None = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.history: collections.deque[JobRecord] = collections.deque(maxlen=1024)
        self.n_submitted = self.n_finished = 0     # each written by one thread only
        self._jobs: "queue.Queue[tuple[Job | EngineCall, float] | None]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="dflash-engine", daemon=True)

    @property
    def status(self) -> str:
        return "failed" if self.error else "ready" if self.ready.is_set() else "loading"

    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30) -> None:
        """Finish the running job's current step, drop queued ones, close the engine."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def submit(self, job: Job) -> Job:
        self.n_submitted += 1
        self._jobs.put((job, time.perf_counter()))
        return job

    def call(self, fn: Callable[["EngineWorker"], object]) -> asyncio.Future:
        """Run fn(worker) in the engine thread after the queued jobs; await the returned future."""
        loop = asyncio.get_running_loop()
        call = EngineCall(fn, loop, loop.create_future())
        self._jobs.put((call, time.perf_counter()))
        return call.future

    @property
    def idle(self) -> bool:
        return self.n_finished == self.n_submitted

    def _run(self) -> None:
        try:
            self.engine = self._make_engine()
        except Exception as e:  # reported by /health, every request and the log
            self.error = str(e) or type(e).__name__
            self._log(f"error: the model failed to load: {e}")
            self._drain()
            return
        if hasattr(self.engine, "keep_prefix"):             # test doubles hold no sequence to reuse
            self.cache = PromptCache(self.engine, self._cache_settings, engine_identity(self.engine))
        self.ready.set()
        self._log("model loaded: ready for requests")
        while True:
            item = self._jobs.get()
            if item is None:
                break
            if isinstance(item[0], EngineCall):
                self._call(item[0])
            else:
                self._serve(*item)
        self._drain()
        self.engine.close()

    def _serve(self, job: Job, queued_at: float) -> None:
        self.running = job                      # GET /slots: is_processing, until the cache is settled too
        try:
            self._serve_job(job, queued_at)
        finally:
            self.running = None

    def _serve_job(self, job: Job, queued_at: float) -> None:
        started = time.perf_counter()
        if job.cancelled.is_set():              # the client left while queued: never start
            job.emit("cancelled")
            self._record(job, 0, "cancelled", queued_at, started)
            return
        try:
            if self.cache is not None:
                n_cached = self.cache.prepare(job.tokens, job.cache_prompt)
                result = self.engine.generate(job.tokens, job.max_tokens, job.sampling, _on_tokens(job),
                                              n_cached=n_cached)
            else:
                result = self.engine.generate(job.tokens, job.max_tokens, job.sampling, _on_tokens(job))
        except Exception as e:
            print(f"dflash-gguf serve: generation failed: {type(e).__name__}: {e}", file=sys.stderr)
            job.emit("error", e)
            self._record(job, 0, "failed", queued_at, started)
            return
        if job.cancelled.is_set():
            job.emit("cancelled")
            self._record(job, len(result.tokens), "cancelled", queued_at, started)
            self._settle()
            return
        tail = job.text.finish()
        if tail:
            job.emit("text", Piece(tail, 0, 0))
        if job.text.stopped:
            result.finish_reason = "stop"
        if job.n_probs:
            try:
                job.probs = self.engine.token_probs(len(job.tokens), result.tokens, job.n_probs)
            except Exception as e:  # noqa: BLE001 - the text is there; the request reports the failure
                job.emit("error", e)
                self._record(job, len(result.tokens), "failed", queued_at, started, result.n_cached)
                return
        job.emit("done", result)
        self._record(job, len(result.tokens), "done", queued_at, started, result.n_cached)
        self._learn(job, result)
        self._settle()

    def _learn(self, job: Job, result: GenerationResult) -> None:
        """Keep a finished request for `train --adapt` (serve --learn); the answer is out already."""
        if self.recorder is None or not result.tokens:
            return
        if self.corpus is not None:
            self.corpus.add(result.tokens)     # the next request's lookup drafts from it
        try:
            self.recorder.record(job.tokens, result.tokens, template=job.template,
                                 drafter=getattr(getattr(self.engine, "drafter_model", None), "path", None))
        except Exception as e:  # noqa: BLE001 - a full disk must not take the server down
            print(f"dflash-gguf serve: recording the request failed: {type(e).__name__}: {e}", file=sys.stderr)

    def _settle(self) -> None:
        """The answer is out: re-decode what the next turn would otherwise re-read (prompt_cache.settle), giving
        way to the next request as soon as one is queued."""
        if self.cache is None:
            return
        try:
            self.cache.settle(self._request_waits)
        except Exception as e:  # noqa: BLE001 - the engine forgot its sequence; the next request starts cold
            print(f"dflash-gguf serve: keeping the conversation failed: {type(e).__name__}: {e}", file=sys.stderr)

    def _request_waits(self) -> bool:
        """A generation (or the stop) is queued. A slot action is not one: it waits for the re-decode, so that a
        saved slot holds the whole conversation."""
        with self._jobs.mutex:
            return any(item is None or isinstance(item[0], Job) for item in self._jobs.queue)

    def _call(self, call: EngineCall) -> None:
        try:
            value, exc = call.fn(self), None
        except Exception as e:  # noqa: BLE001 - handed to the awaiting request
            value, exc = None, e
        _settle(call, value, exc)

    def _record(self, job: Job, n: int, outcome: str, queued_at: float, started: float, n_cached: int = 0) -> None:
        now = time.perf_counter()
        self.history.append(JobRecord(len(job.tokens), job.max_tokens, n, outcome, n_cached, started - queued_at,
                                      now - started))
        self.n_finished += 1

    def _drain(self) -> None:
        """Tell every queued job that it will not run."""
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            if item is None:
                continue
            gone = RuntimeError(self.error or "the server is shutting down")
            if isinstance(item[0], EngineCall):
                _settle(item[0], None, gone)
            else:
                item[0].emit("error", gone)


def _settle(call: EngineCall, value: object, exc: BaseException | None) -> None:
    def settle():
        if not call.future.done():
            call.future.set_exception(exc) if exc is not None else call.future.set_result(value)
    try:
        call.loop.call_soon_threadsafe(settle)
    except RuntimeError:              # the loop is closed: the server is shutting down
        pass


def engine_identity(engine) -> dict:
    """What a cached sequence depends on besides its tokens: the model files and the context's settings."""
    s = engine.settings
    files = {"target": engine.target_model.path, "drafter": getattr(engine.drafter_model, "path", None)}
    out = {k: None if p is None else f"{p.name}:{p.stat().st_size}" for k, p in files.items()}
    return {**out, "n_ctx": s.n_ctx, "flash_attn": s.flash_attn, "cache_type_k": s.cache_type_k,
            "cache_type_v": s.cache_type_v}


def _on_tokens(job: Job):
    """The engine's token callback: text pieces with the token counts behind them (held-back text, e.g. a
    possible stop string, carries its tokens into the next piece)."""
    held = [0, 0]                                        # tokens, accepted drafts not yet sent with text

    def on_tokens(new: list[int]) -> bool:
        held[0] += len(new)
        held[1] += max(len(new) - 1, 0)
        delta = job.text.feed(new)
        if delta:
            job.emit("text", Piece(delta, *held))
            held[0] = held[1] = 0
        return not (job.text.stopped or job.cancelled.is_set())
    return on_tokens


def timings(result: GenerationResult) -> dict:
    """llama-server's `timings`: cache_n (prompt tokens taken from the cache), prompt_n (prefilled), predicted_n,
    their times, draft_n, draft_n_accepted; plus τ and the target calls."""
    t = result.timings
    n = len(result.tokens)
    n_prefilled = result.n_prompt - result.n_cached
    prompt_ms, predicted_ms = 1000 * t.prefill_s, 1000 * t.decode_s
    return {"cache_n": result.n_cached, "prompt_n": n_prefilled, "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_ms / n_prefilled, 3) if n_prefilled else 0.0,
            "prompt_per_second": round(1000 * n_prefilled / prompt_ms, 3) if prompt_ms > 0 else 0.0,
            "predicted_n": n, "predicted_ms": round(predicted_ms, 3),
            "predicted_per_token_ms": round(predicted_ms / n, 3) if n else 0.0,
            "predicted_per_second": round(result.tok_s, 3),
            "draft_n": result.n_drafted, "draft_n_accepted": result.n_accepted, "tau": round(result.tau, 4),
            "target_calls": result.n_target_calls}
