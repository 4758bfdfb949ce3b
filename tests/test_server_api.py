"""The HTTP layer end to end over a scripted fake engine (no native library): the official `openai`
client on reasoning and tool calls, the request shapes Jan and LM Studio send, errors, health while
loading, CORS, and a disconnect that frees the engine at once."""

import json
import threading
import time

import httpx
import pytest

from helpers.server import FakeEngine, LiveServer

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}]
TOOL_REPLY = '<think>\nThe user wants weather.\n</think>\n\nLet me check. <tool_call>\n' \
             '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def reply(prompt: str) -> str:
    if "get_weather" in prompt and "tool\n18 C" not in prompt:
        return TOOL_REPLY
    if "long story" in prompt:
        return "once upon a time " * 400
    return "<think>hmm</think>It is 18 C." if "tool\n18 C" in prompt else "Hello there!"


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine(reply, n_ctx=2048, step_s=0.002)
    srv = LiveServer(lambda: engine, api_key="sk-test").wait_ready()
    srv.engine = engine
    yield srv
    srv.close()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="sk-test", max_retries=0)


def post(server, path, body=None, key="sk-test", raw=None, headers=None):
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    return httpx.post(server.base + path, content=raw if raw is not None else json.dumps(body), headers=headers,
                      timeout=30)


def test_tool_call_and_reasoning_non_stream(client, server):
    r = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "Paris?"}],
                                       tools=WEATHER)
    msg, choice = r.choices[0].message, r.choices[0]
    assert choice.finish_reason == "tool_calls" and msg.content == "Let me check. "
    assert msg.model_extra["reasoning_content"] == "The user wants weather.\n"
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert '"name": "get_weather"' in server.engine.prompts[-1]          # the tools reached the template
    t = r.model_extra["timings"]
    assert t["draft_n"] >= t["draft_n_accepted"] > 0 and t["predicted_n"] == r.usage.completion_tokens

    # the tool result goes back; the template receives the call with object arguments
    follow = [{"role": "user", "content": "Paris?"}, msg.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    r2 = client.chat.completions.create(model="test-model", messages=follow, tools=WEATHER)
    assert r2.choices[0].message.content == "It is 18 C." and r2.choices[0].finish_reason == "stop"
    assert '"arguments": {"city": "Paris"}' in server.engine.prompts[-1].split("<tool_call>")[-1]


def test_tool_call_and_reasoning_stream(client):
    stream = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "Paris?"}],
                                            tools=WEATHER, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert reasoning == "The user wants weather.\n" and content == "Let me check. "
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "get_weather"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_thinking_switch_and_parallel_calls(client, server):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert server.engine.prompts[-1].endswith("<think>\n\n</think>\n\n")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                   extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert server.engine.prompts[-1].endswith("assistant\n<think>\n")
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Paris?"}], tools=WEATHER,
                                       parallel_tool_calls=False, extra_body={"reasoning_format": "none"})
    assert r.choices[0].message.content.startswith("<think>") and len(r.choices[0].message.tool_calls) == 1


def test_jan_request_shape(server):
    """Jan's custom OpenAI-compatible provider: the AI SDK body (stream, include_usage, tools with
    tool_choice auto) merged with Jan's own sampling fields and its "disable reasoning" switch."""
    jan = {"model": "test-model", "max_tokens": 2048, "temperature": 0.7, "top_p": 0.95, "top_k": 20,
           "stream": True, "stream_options": {"include_usage": True},
           "chat_template_kwargs": {"enable_thinking": False},
           "messages": [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": [{"type": "text", "text": "Paris?"}]}],
           "tools": [{"type": "function", "function": {**WEATHER[0]["function"], "strict": False}}],
           "tool_choice": "auto"}
    r = post(server, "/v1/chat/completions", jan, headers={"Origin": "tauri://localhost"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    lines = [ln for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert chunks[-1]["usage"]["prompt_tokens"] > 0 and chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-2]["timings"]["draft_n"] > 0                         # what Jan reads for tokens/s
    assert r.headers["access-control-allow-origin"] in ("*", "tauri://localhost")


def test_lmstudio_request_shape(server):
    """LM Studio's generator plugins use the openai node client: history with a previous tool call and
    its result, the tool list, stream: true."""
    body = {"model": "test-model", "stream": True,
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Paris?"},
                         {"role": "assistant", "content": "",
                          "tool_calls": [{"id": "call_1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
            "tools": WEATHER, "temperature": 0.8}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "It is 18 C." and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completions_endpoint(client):
    r = client.completions.create(model="m", prompt="Say hi", max_tokens=5)
    assert r.choices[0].text == "Hello" and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    text = "".join(c.choices[0].text for c in client.completions.create(model="m", prompt="Say hi", stream=True)
                   if c.choices)
    assert text == "Hello there!"
    r = client.completions.create(model="m", prompt="Say hi", stop=[" there"])
    assert r.choices[0].text == "Hello" and r.choices[0].finish_reason == "stop"


def test_errors_have_the_openai_shape(server):
    ok = {"messages": [{"role": "user", "content": "hi"}]}
    for key in (None, "wrong"):
        r = post(server, "/v1/chat/completions", ok, key=key)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = post(server, "/v1/chat/completions", {**ok, "mirostat": 2})
    assert r.status_code == 400 and r.json()["error"] == {
        "message": r.json()["error"]["message"], "type": "invalid_request_error", "param": "mirostat",
        "code": "unsupported_parameter"}
    r = post(server, "/v1/chat/completions", {**ok, "logit_bias": {"5": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias" and "logit_bias" in r.text
    r = post(server, "/v1/chat/completions", raw=b'{"messages": [')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 3000}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = post(server, "/v1/nothing-here", ok)
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(server.base + "/health").status_code == 200        # no key needed for health
    pre = httpx.options(server.base + "/v1/chat/completions",
                        headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                                 "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] in ("*", "http://localhost:3000")


def test_disconnect_mid_stream_frees_the_engine(server):
    body = {"messages": [{"role": "user", "content": "a long story"}], "stream": True}
    before = len(server.worker.history)
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body,
                      headers={"Authorization": "Bearer sk-test"}, timeout=30) as r:
        for line in r.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                break                                   # leave after the first words
    t0 = time.perf_counter()
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    waited = time.perf_counter() - t0
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello there!"
    gone = server.worker.history[before]
    # the whole story is 6800 tokens at 3 per 2 ms step (~4.5 s); the engine stopped long before
    assert gone.outcome == "cancelled" and gone.n_generated < 3000, gone
    assert waited < gone.run_s + 5


def test_health_is_503_while_loading_then_200():
    gate = threading.Event()

    def slow_load():
        gate.wait(30)
        return FakeEngine(reply)

    srv = LiveServer(slow_load)
    try:
        r = httpx.get(srv.base + "/health")
        assert r.status_code == 503 and r.json() == {"error": {"code": 503, "message": "Loading model",
                                                               "type": "unavailable_error"}}
        r = post(srv, "/v1/completions", {"prompt": "x"}, key=None)
        assert r.status_code == 503
        assert httpx.get(srv.base + "/v1/models").json()["data"][0]["id"] == "test-model"
        gate.set()
        srv.wait_ready(30)
        assert httpx.get(srv.base + "/health").json() == {"status": "ok"}
        assert post(srv, "/v1/completions", {"prompt": "x"}, key=None).status_code == 200
    finally:
        gate.set()
        srv.close()


def test_failed_load_is_reported_by_health():
    from dflash_gguf.errors import UserError

    def broken():
        raise UserError("draft.gguf: the drafter does not fit this target")

    srv = LiveServer(broken)
    try:
        for _ in range(100):
            if srv.worker.status == "failed":
                break
            time.sleep(0.02)
        r = httpx.get(srv.base + "/health")
        assert r.status_code == 503 and "does not fit" in r.json()["error"]["message"]
    finally:
        srv.close()


def test_generation_errors_map_to_status_and_the_worker_carries_on():
    from dflash_gguf.errors import SetupError

    def reply(prompt: str) -> str:
        if "setup" in prompt:
            raise SetupError("the CUDA build is missing: dflash-gguf build --backend cuda")
        if "crash" in prompt:
            raise RuntimeError("decode failed")
        return "fine"

    srv = LiveServer(lambda: FakeEngine(reply)).wait_ready()
    try:
        r = post(srv, "/v1/completions", {"prompt": "setup"}, key=None)
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error" and "CUDA" in r.text
        r = post(srv, "/v1/completions", {"prompt": "crash"}, key=None)
        assert r.status_code == 500 and "decode failed" in r.json()["error"]["message"]
        r = post(srv, "/v1/completions", {"prompt": "crash", "stream": True}, key=None)
        assert r.status_code == 200 and '"error"' in r.text and r.text.rstrip().endswith("data: [DONE]")
        r = post(srv, "/v1/completions", {"prompt": "ok"}, key=None)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "fine"
        assert [rec.outcome for rec in srv.worker.history] == ["failed", "failed", "failed", "done"]
    finally:
        srv.close()
