"""A live server on 127.0.0.1 (uvicorn in a thread, random free port) and a scripted fake engine."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from dflash_gguf.engine.loop import GenerationResult
from dflash_gguf.settings import EngineSettings

# A Hermes/Qwen-style template: tools in the system turn, tool calls in history, and a thinking switch
# (enable_thinking true opens the think block in the prompt, false closes an empty one, as Qwen3 does)
TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
You may call these functions:
{% for t in tools %}{{ t | tojson }}
{% endfor %}Answer a call as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>
{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>\
{% endfor %}{% endif %}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking %}<think>
{% elif enable_thinking is defined %}<think>

</think>

{% endif %}{% endif %}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """create_app over an EngineWorker, served by uvicorn in a daemon thread."""

    def __init__(self, make_engine: Callable[[], object], api_key: str | None = None,
                 chat_template: str | None = None, model_id: str = "test-model", cache=None):
        import uvicorn

        from dflash_gguf.server.app import ServerConfig, create_app
        from dflash_gguf.server.worker import EngineWorker
        self.worker = EngineWorker(make_engine, cache=cache).start()
        self.port = free_port()
        self.app = create_app(self.worker, ServerConfig(model_id, api_key, chat_template=chat_template))
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        self.base = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300) -> "LiveServer":
        self.worker.ready.wait(timeout)
        assert self.worker.status == "ready", self.worker.error
        return self

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every submitted job has finished (and has its JobRecord)."""
        deadline = time.time() + timeout
        while not self.worker.idle:
            assert time.time() < deadline
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.worker.stop(15)


class FakeModel:
    """Byte-level tokens (id = byte value), as much of wrappers.Model as the server uses."""
    path = Path("fake.gguf")
    n_vocab = 256

    def __init__(self, template: str | None):
        self._template = template

    def chat_template(self):
        return self._template

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode())

    def token_bytes(self, t: int, *, special: bool = False) -> bytes:
        return bytes([t])

    def bos(self) -> int:
        return 1

    def eos(self) -> int:
        return 2


class FakeEngine:
    """Replies with `reply(prompt_text)`, three bytes per step, `step_s` seconds a step; records prompts."""

    def __init__(self, reply: Callable[[str], str], template: str | None = TOOLS_TEMPLATE, n_ctx: int = 4096,
                 step_s: float = 0.0):
        self.reply, self.step_s = reply, step_s
        self.target_model = FakeModel(template)
        self.target = SimpleNamespace(n_ctx=n_ctx)
        self.settings = EngineSettings(n_ctx=n_ctx)
        self.prompts: list[str] = []

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self.target_model.tokenize(text)

    def generate(self, prompt, max_tokens, sampling, on_tokens=None, speculative=True) -> GenerationResult:
        text = bytes(prompt).decode()
        self.prompts.append(text)
        out = list(self.reply(text).encode())[:max_tokens]
        res = GenerationResult([], len(prompt), finish_reason="length" if len(out) == max_tokens else "stop")
        t0 = time.perf_counter()
        for i in range(0, len(out), 3):
            step = out[i:i + 3]
            res.tokens += step
            res.n_target_calls += 1
            res.n_drafted += 3
            res.n_accepted += len(step) - 1
            time.sleep(self.step_s)
            if on_tokens is not None and on_tokens(step) is False:
                res.finish_reason = "stop"
                break
        res.timings.total_s = time.perf_counter() - t0
        return res

    def close(self) -> None:
        pass
