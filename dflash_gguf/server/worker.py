"""One thread owns the Engine; requests queue up and run one at a time, never sharing state.

An Engine holds one sequence (target KV + drafter KV), so jobs are strictly sequential. Each job
carries its own asyncio queue: the engine thread hands it text and the final result through
`loop.call_soon_threadsafe`, and the engine's token callback returns False as soon as the job is
cancelled (client gone), which ends that generation at its next step and frees the engine.
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

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, kind: str, payload: object = None) -> None:
        """Called from the engine thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:              # the loop is closed: the server is shutting down
            pass


@dataclass
class JobRecord:
    """What happened to a job, kept for /health-style introspection and tests."""
    n_prompt: int
    max_tokens: int
    n_generated: int
    outcome: str                          # done | cancelled | failed
    queued_s: float
    run_s: float


class EngineWorker:
    """States: loading → ready (or failed). `submit` hands a job to the engine thread."""

    def __init__(self, make_engine: Callable[[], object], log: Callable[[str], None] | None = None):
        self._make_engine = make_engine
        self._log = log or (lambda msg: None)
        self.engine = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.history: collections.deque[JobRecord] = collections.deque(maxlen=1024)
        self.n_submitted = self.n_finished = 0     # each written by one thread only
        self._jobs: "queue.Queue[tuple[Job, float] | None]" = queue.Queue()
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
        self.ready.set()
        self._log("model loaded: ready for requests")
        while True:
            item = self._jobs.get()
            if item is None:
                break
            self._serve(*item)
        self._drain()
        self.engine.close()

    def _serve(self, job: Job, queued_at: float) -> None:
        started = time.perf_counter()
        if job.cancelled.is_set():              # the client left while queued: never start
            job.emit("cancelled")
            self._record(job, 0, "cancelled", queued_at, started)
            return
        try:
            result = self.engine.generate(job.tokens, job.max_tokens, job.sampling, _on_tokens(job))
        except Exception as e:
            print(f"dflash-gguf serve: generation failed: {type(e).__name__}: {e}", file=sys.stderr)
            job.emit("error", e)
            self._record(job, 0, "failed", queued_at, started)
            return
        if job.cancelled.is_set():
            job.emit("cancelled")
            self._record(job, len(result.tokens), "cancelled", queued_at, started)
            return
        tail = job.text.finish()
        if tail:
            job.emit("text", tail)
        if job.text.stopped:
            result.finish_reason = "stop"
        job.emit("done", result)
        self._record(job, len(result.tokens), "done", queued_at, started)

    def _record(self, job: Job, n: int, outcome: str, queued_at: float, started: float) -> None:
        now = time.perf_counter()
        self.history.append(JobRecord(len(job.tokens), job.max_tokens, n, outcome, started - queued_at, now - started))
        self.n_finished += 1

    def _drain(self) -> None:
        """Tell every queued job that it will not run."""
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[0].emit("error", RuntimeError(self.error or "the server is shutting down"))


def _on_tokens(job: Job):
    def on_tokens(new: list[int]) -> bool:
        delta = job.text.feed(new)
        if delta:
            job.emit("text", delta)
        return not (job.text.stopped or job.cancelled.is_set())
    return on_tokens


def timings(result: GenerationResult) -> dict:
    """llama-server's `timings` (prompt_n, predicted_n, …, draft_n, draft_n_accepted) plus τ."""
    t = result.timings
    n = len(result.tokens)
    prompt_ms, predicted_ms = 1000 * t.prefill_s, 1000 * t.decode_s
    return {"prompt_n": result.n_prompt, "prompt_ms": round(prompt_ms, 3),
            "prompt_per_second": round(1000 * result.n_prompt / prompt_ms, 3) if prompt_ms > 0 else 0.0,
            "predicted_n": n, "predicted_ms": round(predicted_ms, 3),
            "predicted_per_second": round(result.tok_s, 3),
            "draft_n": result.n_drafted, "draft_n_accepted": result.n_accepted, "tau": round(result.tau, 4),
            "target_calls": result.n_target_calls}
