"""The server over the real engine (SmolLM2-135M Q4_1 + a random DFlash drafter) with the official
`openai` client: chat (non-stream and stream), completions, tools and reasoning through a Qwen-style
template, the Jan / LM Studio request shapes, errors, and a client that leaves mid-stream."""

import json

import httpx
import pytest

from dflash_gguf.settings import EngineSettings
from helpers.engine import write_random_drafter
from helpers.server import TOOLS_TEMPLATE, LiveServer

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}]
HI = [{"role": "user", "content": "What is the capital of France?"}]


def _make_engine(drafter_dir):
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.packaged_models import smollm2
    target = smollm2()
    drafter = write_random_drafter(target, drafter_dir / "drafter.gguf", taps=[1, 15, 28])
    settings = EngineSettings(target=target, drafter=drafter, n_ctx=1024, n_threads=1, adaptive=False, draft_max=3)
    return lambda: Engine(settings)


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """SmolLM2's own chat template (no tools, no thinking switch)."""
    srv = LiveServer(_make_engine(tmp_path_factory.mktemp("d")), api_key="secret").wait_ready()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def smol_qwen(tmp_path_factory):
    """The same model behind a Qwen/Hermes-style template (--chat-template): tools and a thinking switch."""
    srv = LiveServer(_make_engine(tmp_path_factory.mktemp("d")), chat_template=TOOLS_TEMPLATE).wait_ready()
    yield srv
    srv.close()


def client(srv, key="secret"):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=key, max_retries=0)


def test_models_and_chat_non_stream(smol):
    c = client(smol)
    assert [m.id for m in c.models.list().data] == ["test-model"]
    r = c.chat.completions.create(model="test-model", messages=HI, temperature=0, max_tokens=16, seed=1)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 10
    t = r.model_extra["timings"]
    assert t["predicted_n"] == r.usage.completion_tokens and t["prompt_n"] + t["cache_n"] == r.usage.prompt_tokens
    assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"]     # speculation ran


def test_chat_stream_chunks_and_usage_match_non_stream(smol):
    c = client(smol)
    chunks = list(c.chat.completions.create(model="m", messages=HI, temperature=0, max_tokens=16, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0] is chunks[-2] and finals[0].model_extra["timings"]["draft_n"] > 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == finals[0].model_extra[
        "timings"]["predicted_n"]
    same = c.chat.completions.create(model="m", messages=HI, temperature=0, max_tokens=16)
    assert same.choices[0].message.content == text                       # T=0: streaming changes nothing


def test_sampling_parameters_are_applied(smol):
    c = client(smol)
    runs = [c.chat.completions.create(model="m", messages=HI, temperature=1.5, top_p=0.95, max_tokens=12, seed=s,
                                      extra_body={"top_k": 40, "min_p": 0.01}).choices[0].message.content for s in (7, 7)]
    assert runs[0] == runs[1]                                             # the seed is applied
    greedy = c.chat.completions.create(model="m", messages=HI, temperature=0, max_tokens=12)
    capped = c.chat.completions.create(model="m", messages=HI, temperature=0, max_completion_tokens=3)
    assert capped.usage.completion_tokens <= 3 and capped.choices[0].finish_reason == "length"
    assert greedy.choices[0].message.content.startswith(capped.choices[0].message.content)


def test_completions_stop_and_stream(smol):
    c = client(smol)
    full = c.completions.create(model="m", prompt="def add(a, b):\n", max_tokens=16, temperature=0).choices[0].text
    assert full.strip()
    stop = full.strip()[:3]
    cut = c.completions.create(model="m", prompt="def add(a, b):\n", max_tokens=16, temperature=0, stop=[stop])
    assert stop not in cut.choices[0].text and full.startswith(cut.choices[0].text)
    assert cut.choices[0].finish_reason == "stop"
    streamed = c.completions.create(model="m", prompt="def add(a, b):\n", max_tokens=16, temperature=0, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == full


def test_tools_reach_the_template(smol_qwen, smol):
    c = client(smol_qwen)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    plain = c.chat.completions.create(model="m", messages=ask, temperature=0, max_tokens=8)
    with_tools = c.chat.completions.create(model="m", messages=ask, tools=WEATHER, temperature=0, max_tokens=8)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20     # the tool schema is in the prompt
    assert with_tools.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # SmolLM2's own template cannot render tools: refused, not silently dropped
    with pytest.raises(openai.BadRequestError) as e:
        client(smol).chat.completions.create(model="m", messages=ask, tools=WEATHER, max_tokens=8)
    assert e.value.body["param"] == "tools"


def test_reasoning_content_when_the_template_opens_think(smol_qwen):
    c = client(smol_qwen)
    r = c.chat.completions.create(model="m", messages=HI, temperature=0, max_tokens=12,
                                  extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    msg = r.choices[0].message
    assert msg.model_extra.get("reasoning_content")                     # generation started inside <think>
    stream = c.chat.completions.create(model="m", messages=HI, temperature=0, max_tokens=12, stream=True,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    deltas = [ch.choices[0].delta for ch in stream if ch.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == msg.model_extra[
        "reasoning_content"]
    off = c.chat.completions.create(model="m", messages=HI, temperature=0, max_tokens=12,
                                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content and not off.choices[0].message.model_extra.get("reasoning_content")
    assert off.usage.prompt_tokens > r.usage.prompt_tokens                # the closed empty think block


def _post(srv, body, key=None, path="/v1/chat/completions"):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(srv.base + path, json=body, headers=headers, timeout=120)


def test_jan_and_lmstudio_request_shapes(smol_qwen):
    jan = {"model": "test-model", "max_tokens": 8, "temperature": 0.7, "top_p": 0.95, "top_k": 20,
           "stream": True, "stream_options": {"include_usage": True},
           "chat_template_kwargs": {"enable_thinking": False},
           "messages": [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
           "tools": [{"type": "function", "function": {**WEATHER[0]["function"], "strict": False}}],
           "tool_choice": "auto"}
    r = _post(smol_qwen, jan)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    lmstudio = {"model": "test-model", "stream": True, "temperature": 0.8, "tools": WEATHER,
                "messages": [{"role": "user", "content": "Weather in Paris?"},
                             {"role": "assistant", "content": "", "tool_calls": [
                                 {"id": "call_1", "type": "function",
                                  "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                             {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}],
                "max_tokens": 8}
    r = _post(smol_qwen, lmstudio)
    assert r.status_code == 200, r.text
    chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


def test_errors(smol):
    ok = {"messages": HI, "max_tokens": 4}
    assert _post(smol, ok).status_code == 401
    assert _post(smol, ok, key="wrong").status_code == 401
    r = _post(smol, {**ok, "presence_penalty": 0.5}, key="secret")
    assert r.status_code == 400 and r.json()["error"]["param"] == "presence_penalty"
    r = httpx.post(smol.base + "/v1/chat/completions", content=b"{not json", timeout=30,
                   headers={"Authorization": "Bearer secret"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = _post(smol, {**ok, "messages": [{"role": "user", "content": "word " * 2000}]}, key="secret")
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = _post(smol, {"prompt": "hello " * 1100, "max_tokens": 4}, key="secret", path="/v1/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_client_leaving_mid_stream_frees_the_engine(smol):
    before = len(smol.worker.history)
    body = {"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}], "max_tokens": 400,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", smol.base + "/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": "Bearer secret"}) as r:
        for line in r.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                break
    r = client(smol).chat.completions.create(model="m", messages=HI, temperature=0, max_tokens=4)
    assert r.choices[0].message.content
    left = smol.worker.history[before]
    assert left.outcome == "cancelled" and left.n_generated < 100, left
