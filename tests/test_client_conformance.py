"""Client conformance: the requests desktop apps and front-ends send, replayed against a live server on the
embedded default model (SmolLM2-135M-Instruct Q4_1 + the shipped DFlash drafter), and the responses parsed the
way each app parses them. One server for the whole module, short answers.

Where each shape comes from (read 2026-11-26; versions move):
- openai SDK (Python, the `openai` package of the test extra): its own request and response types.
- LM Studio: a generator plugin reports what it reads through GeneratorController (lmstudio-ai/lmstudio-js,
  packages/lms-client/src/plugins/processing/GeneratorController.ts): fragmentGenerated(text, {tokenCount,
  containsDrafted, reasoningType}), toolCallGenerationStarted / NameReceived / ArgumentFragmentGenerated / Ended /
  Failed, and abortSignal. LM Studio's `lmstudio/openai-compat-endpoint` plugin streams an OpenAI chat completion
  into those calls (docs: lmstudio.ai/docs/typescript/plugins/generator, "tool-calling generators"); its own
  source was not reachable from here, so `LMStudioGenerator` below follows the controller's contract: text and
  reasoning deltas, tool-call deltas by index, the stream's end, and cancelling the request when the user stops.
- Open WebUI: backend/open_webui/utils/middleware.py, the streaming handler runs on every chunk
  `usage = data.get("usage", {}) or {}; usage.update(data.get("timings", {}))` (a `"timings": null` raises), then
  `choices[0].delta` (`content`, `reasoning_content`).
- SillyTavern, llama.cpp mode: status `GET {base}/v1/models` (src/endpoints/backends/text-completions.js);
  tokens `POST /tokenize {model, content, add_special?, with_pieces?}` reading `tokens`
  (src/endpoints/tokenizers.js); generation `POST /completion` with the body of
  public/scripts/textgen-settings.js createTextGenGenerationData (llama.cpp names beside ooba/vLLM ones, which
  llama-server ignores; `cache_prompt: true`, `samplers`, `grammar: ""`, `logit_bias: []`, `n_probs` when token
  probabilities are on), the stream read as `data: {content, stop}` lines; `GET /props` (`chat_template`).
- Jan, custom OpenAI-compatible provider: janhq/jan web-app/src/lib/model-factory.ts createOpenAICompatibleModel:
  the AI SDK's @ai-sdk/openai-compatible with `includeUsage: true` (`stream_options: {include_usage: true}`), a
  Bearer key, the model's inference parameters merged into the body; `{base}/models` lists the model.
"""

from __future__ import annotations

import json

import httpx
import pytest

from dflash_gguf.settings import EngineSettings
from helpers.server import FakeEngine, LiveServer

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

KEY = "sk-conformance"
HI = [{"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "What is the capital of France?"}]
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The embedded default model, as `dflash-gguf serve` loads it (smaller context, one thread for the tests, and
    a fixed draft length: the adaptive policy may decode plain on a machine where drafting does not pay, and the
    tests require drafts)."""
    from dflash_gguf.engine.session import Engine
    from dflash_gguf.server.prompt_cache import CacheSettings
    settings = EngineSettings(n_ctx=2048, n_threads=1, adaptive=False)
    srv = LiveServer(lambda: Engine(settings), api_key=KEY, model_id="smollm2-135m-instruct-dflash",
                     cache=CacheSettings(slot_dir=tmp_path_factory.mktemp("slots"))).wait_ready()
    yield srv
    srv.close()


def sdk(srv) -> "openai.OpenAI":
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)


def post(srv, path: str, body: dict | None = None, method: str = "POST") -> httpx.Response:
    return httpx.request(method, srv.base + path, json=body, timeout=120, headers={"Authorization": f"Bearer {KEY}"})


def sse(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


# -- openai SDK ---------------------------------------------------------------------------------------------
def test_openai_sdk_chat_stream_usage_and_cache(live):
    c = sdk(live)
    chunks = list(c.chat.completions.create(model="m", messages=HI, temperature=0, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    final = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason][0]
    assert text and final.model_extra["timings"]["predicted_n"] == chunks[-1].usage.completion_tokens
    turn2 = HI + [{"role": "assistant", "content": text}, {"role": "user", "content": "And of Italy?"}]
    warm = c.chat.completions.create(model="m", messages=turn2, temperature=0, max_tokens=12)
    cold = c.chat.completions.create(model="m", messages=turn2, temperature=0, max_tokens=12,
                                     extra_body={"cache_prompt": False})
    tw, tc = warm.model_extra["timings"], cold.model_extra["timings"]
    # turn 1 is not read again; from 64 tokens on, one wide ubatch ending at the new message is (engine/prefix.py)
    n = warm.usage.prompt_tokens
    assert tw["cache_n"] >= (chunks[-1].usage.prompt_tokens if n < 64 else n - 64) > 0
    assert tc["cache_n"] == 0
    assert tw["cache_n"] + tw["prompt_n"] == warm.usage.prompt_tokens == tc["prompt_n"]
    assert warm.usage.prompt_tokens_details.cached_tokens == tw["cache_n"]
    assert warm.choices[0].message.content == cold.choices[0].message.content   # greedy: identical text


def test_openai_sdk_completions(live):
    c = sdk(live)
    full = c.completions.create(model="m", prompt="The three primary colours are", max_tokens=8, temperature=0)
    streamed = c.completions.create(model="m", prompt="The three primary colours are", max_tokens=8,
                                    temperature=0, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == full.choices[0].text


# -- LM Studio (generator plugin over the OpenAI stream) ---------------------------------------------------
class LMStudioGenerator:
    """What a generator plugin hands GeneratorController for one streamed chat completion."""

    def __init__(self):
        self.calls: list[tuple] = []
        self._open: dict[int, dict] = {}

    def feed(self, chunk: dict) -> None:
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            counts = chunk.get("dflash") or {}
            opts = {"tokenCount": counts.get("tokens"), "containsDrafted": counts.get("drafted", 0) > 0}
            if delta.get("reasoning_content"):
                self.calls.append(("fragmentGenerated", delta["reasoning_content"], {**opts, "reasoningType": "reasoning"}))
            if delta.get("content"):
                self.calls.append(("fragmentGenerated", delta["content"], {**opts, "reasoningType": "none"}))
            for call in delta.get("tool_calls") or []:
                state = self._open.get(call["index"])
                if state is None:
                    assert call.get("id") and call.get("type") == "function", call   # a new call starts here
                    state = self._open[call["index"]] = {"id": call["id"], "name": None, "args": ""}
                    self.calls.append(("toolCallGenerationStarted",))
                fn = call.get("function") or {}
                if fn.get("name"):
                    state["name"] = fn["name"]
                    self.calls.append(("toolCallGenerationNameReceived", fn["name"]))
                if fn.get("arguments"):
                    state["args"] += fn["arguments"]
                    self.calls.append(("toolCallGenerationArgumentFragmentGenerated", fn["arguments"]))
            if choice.get("finish_reason"):
                for state in self._open.values():
                    self.calls.append(("toolCallGenerationEnded", {"type": "function", "id": state["id"],
                                                                   "name": state["name"],
                                                                   "arguments": json.loads(state["args"] or "{}")}))
                self._open.clear()


def test_lmstudio_plugin_stream_and_draft_counts(live):
    """Fails when the server reports no drafts (`draft_n` 0, or `dflash.drafted` 0 in every chunk) while the
    drafter runs."""
    before = len(live.worker.history)
    body = {"model": "smollm2-135m-instruct-dflash", "messages": HI, "stream": True, "temperature": 0.8,
            "max_tokens": 24, "seed": 5}
    gen = LMStudioGenerator()
    r = post(live, "/v1/chat/completions", body)
    for chunk in sse(r.text):
        gen.feed(chunk)
    fragments = [c for c in gen.calls if c[0] == "fragmentGenerated"]
    assert fragments and all(c[2]["tokenCount"] >= 1 for c in fragments)
    final = sse(r.text)[-1]
    assert sum(c[2]["tokenCount"] for c in fragments) <= final["timings"]["predicted_n"]
    drafted = sum(ch.get("dflash", {}).get("drafted", 0) for ch in sse(r.text))
    live.wait_idle()
    assert live.worker.history[before].outcome == "done"
    assert final["timings"]["draft_n"] >= final["timings"]["draft_n_accepted"] >= drafted > 0


TOOL_REPLY = ('<think>\nThe user wants the weather.\n</think>\n\nChecking. <tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


@pytest.fixture(scope="module")
def scripted():
    """Tool calls and reasoning need a model that makes them: a scripted engine behind the same HTTP layer."""
    engine = FakeEngine(lambda prompt: TOOL_REPLY, n_ctx=8192)
    srv = LiveServer(lambda: engine, api_key=KEY).wait_ready()
    yield srv
    srv.close()


def test_lmstudio_stop_button_ends_the_generation_and_the_conversation_goes_on(live):
    """The plugin passes ctl.abortSignal to its request: pressing stop closes the connection mid-stream. The real
    engine stops, and the next turn, which continues the cut-short answer, reuses the conversation from the prompt
    cache and answers what a cold start answers. Fails when the engine keeps generating after the client left
    (the token callback ignores the cancel), or when a stopped generation's conversation is not kept."""
    before = len(live.worker.history)
    story = [HI[0], {"role": "user", "content": "Tell a long story about a lighthouse keeper."}]
    body = {"model": "m", "stream": True, "messages": story, "temperature": 0, "max_tokens": 300}
    text = ""
    with httpx.stream("POST", live.base + "/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}"}) as s:
        for line in s.iter_lines():
            for chunk in sse(line):
                text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
            if len(text) >= 40:
                break
    live.wait_idle()
    stopped = live.worker.history[before]
    assert stopped.outcome == "cancelled" and stopped.n_generated < 150, stopped
    turn2 = story + [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on, briefly."}]
    c = sdk(live)
    warm = c.chat.completions.create(model="m", messages=turn2, temperature=0, max_tokens=16)
    cold = c.chat.completions.create(model="m", messages=turn2, temperature=0, max_tokens=16,
                                     extra_body={"cache_prompt": False})
    tw = warm.model_extra["timings"]
    # the cut-short answer is reused too, not only the prompt before it
    assert tw["cache_n"] > stopped.n_prompt and cold.model_extra["timings"]["cache_n"] == 0
    assert tw["draft_n"] > 0
    assert warm.choices[0].message.content == cold.choices[0].message.content   # greedy: identical text


def test_lmstudio_plugin_reasoning_and_tool_call_deltas(scripted):
    body = {"model": "m", "stream": True, "tools": WEATHER,
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    gen = LMStudioGenerator()
    for chunk in sse(post(scripted, "/v1/chat/completions", body).text):
        gen.feed(chunk)
    kinds = [c[0] for c in gen.calls]
    reasoning = "".join(c[1] for c in gen.calls if c[0] == "fragmentGenerated" and c[2]["reasoningType"] == "reasoning")
    assert reasoning == "The user wants the weather.\n"
    start = kinds.index("toolCallGenerationStarted")
    assert kinds[start:] == ["toolCallGenerationStarted", "toolCallGenerationNameReceived",
                             "toolCallGenerationArgumentFragmentGenerated", "toolCallGenerationEnded"]
    assert gen.calls[-1][1] == {"type": "function", "id": gen.calls[-1][1]["id"], "name": "get_weather",
                                "arguments": {"city": "Paris"}}


# -- Open WebUI ----------------------------------------------------------------------------------------------
def test_open_webui_merges_timings_from_every_chunk(live):
    body = {"model": "smollm2-135m-instruct-dflash", "messages": HI, "stream": True, "seed": 42,
            "temperature": 0.7, "max_tokens": 12, "stream_options": {"include_usage": True}}
    r = post(live, "/v1/chat/completions", body)
    usage, content = {}, ""
    for data in sse(r.text):
        merged = data.get("usage", {}) or {}
        merged.update(data.get("timings", {}))          # TypeError on "timings": null
        usage.update(merged)
        for choice in data.get("choices", []):
            content += choice["delta"].get("content") or ""
    assert content and usage["completion_tokens"] == usage["predicted_n"] >= 1
    assert {"prompt_n", "cache_n", "predicted_per_second", "draft_n", "draft_n_accepted"} <= set(usage)
    assert '"timings": null' not in r.text and '"usage": null' not in r.text


# -- SillyTavern, llama.cpp mode -------------------------------------------------------------------------------
def sillytavern_body(prompt: str, stream: bool, n_probs: int | None = None) -> dict:
    """createTextGenGenerationData for type llamacpp with SillyTavern's neutral sampler defaults."""
    body = {"prompt": prompt, "model": "", "max_new_tokens": 16, "max_tokens": 16, "temperature": 0.7, "top_p": 1,
            "typical_p": 1, "typical": 1, "min_p": 0, "repetition_penalty": 1, "frequency_penalty": 0,
            "presence_penalty": 0, "top_k": 0, "skew": 0, "min_tokens": 0, "add_bos_token": True,
            "smoothing_factor": 0, "smoothing_curve": 1, "dry_allowed_length": 2, "dry_multiplier": 0,
            "dry_base": 1.75, "dry_sequence_breakers": ["\n", ":", "\"", "*"], "dry_penalty_last_n": 0,
            "max_tokens_second": 0, "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "tfs_z",
                                                 "typical_p", "top_p", "min_p", "xtc", "temperature"],
            "stopping_strings": ["\nUser:"], "stop": ["\nUser:"], "truncation_length": 2048, "ban_eos_token": False,
            "skip_special_tokens": True, "include_reasoning": True, "top_a": 0, "tfs": 1, "mirostat_mode": 0,
            "mirostat_tau": 5, "mirostat_eta": 0.1, "custom_token_bans": "", "banned_strings": [],
            "api_type": "llamacpp", "api_server": "http://127.0.0.1", "xtc_threshold": 0.1, "xtc_probability": 0,
            "nsigma": 0, "top_n_sigma": 0, "min_keep": 0, "rep_pen": 1, "rep_pen_range": 0,
            "repetition_penalty_range": 0, "seed": 7, "guidance_scale": 1, "negative_prompt": "",
            "repeat_penalty": 1, "repeat_last_n": 0, "n_predict": 16, "num_predict": 16, "num_ctx": 2048,
            "mirostat": 0, "ignore_eos": False, "rep_pen_slope": 1, "n": 1, "logit_bias": [], "grammar": "",
            "cache_prompt": True, "stream": stream}
    if n_probs:
        body["n_probs"] = n_probs
    return body


def test_sillytavern_status_props_tokenize_and_slots(live):
    assert post(live, "/v1/models", method="GET").json()["data"][0]["id"] == "smollm2-135m-instruct-dflash"
    props = post(live, "/props", method="GET").json()
    assert "<|im_start|>" in props["chat_template"] and props["default_generation_settings"]["n_ctx"] == 2048
    assert props["total_slots"] == 1 and props["model_path"].endswith(".gguf") and props["build_info"]
    ids = post(live, "/tokenize", {"model": "", "content": "Hello world"}).json()["tokens"]
    assert ids and all(isinstance(t, int) for t in ids)
    pieces = post(live, "/tokenize", {"content": "Hello world", "with_pieces": True, "add_special": True}).json()
    assert "".join(p["piece"] for p in pieces["tokens"] if isinstance(p["piece"], str)).endswith("Hello world")
    assert post(live, "/detokenize", {"tokens": ids}).json()["content"] == "Hello world"
    slots = post(live, "/slots", method="GET").json()
    assert slots[0]["id"] == 0 and slots[0]["n_ctx"] == 2048 and slots[0]["is_processing"] is False


def test_sillytavern_completion_stream_probs_and_refusals(live):
    prompt = "User: Name three fruits.\nAssistant:"
    # greedy, so that the two requests must agree: at T > 0 a seed reproduces a text only from the same cache
    # state (the drafts, and with them the random draws, depend on it; the distribution does not)
    r = post(live, "/completion", {**sillytavern_body(prompt, stream=True), "temperature": 0})
    assert r.status_code == 200, r.text
    chunks = sse(r.text)
    text = "".join(c["content"] for c in chunks if not c["stop"])
    final = chunks[-1]
    assert final["stop"] is True and final["stop_type"] in ("eos", "limit", "word") and text
    assert final["timings"]["predicted_n"] == final["tokens_predicted"] and "data: [DONE]" not in r.text
    plain = post(live, "/completion", {**sillytavern_body(prompt, stream=False, n_probs=3), "temperature": 0}).json()
    assert plain["content"] == text                                     # stream or not, the same text
    probs = plain["completion_probabilities"]
    assert len(probs) == plain["tokens_predicted"] and len(probs[0]["top_logprobs"]) == 3
    assert all(p["logprob"] <= 0 and p["top_logprobs"][0]["logprob"] >= p["logprob"] for p in probs)
    bad = post(live, "/completion", {**sillytavern_body(prompt, stream=False), "repeat_penalty": 1.1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "repeat_penalty"
    grammar = post(live, "/completion", {**sillytavern_body(prompt, stream=False), "grammar": "root ::= \"a\""})
    assert grammar.status_code == 400 and grammar.json()["error"]["param"] == "grammar"


def test_slot_save_restore_erase(live):
    """A conversation saved to a slot file, erased and restored gives what a cold start gives to the last bit: the
    same text and the same token probabilities (rescored from the restored KV; test_prompt_cache.py compares the
    drafter's half). Fails when the restore brings back the token list without the KV (the engine starts cold)."""
    body = {**sillytavern_body("User: Name three fruits.\nAssistant:", stream=False, n_probs=3), "temperature": 0}
    first = post(live, "/completion", body).json()
    saved = post(live, "/slots/0?action=save", {"filename": "chat.bin"}).json()
    assert saved["n_saved"] == first["tokens_evaluated"] + first["tokens_predicted"] - 1 > 10
    assert saved["n_written"] > 0 and "save_ms" in saved["timings"]
    assert post(live, "/slots/0?action=erase").json()["n_erased"] == saved["n_saved"]
    restored = post(live, "/slots/0?action=restore", {"filename": "chat.bin"}).json()
    assert restored["n_restored"] == saved["n_saved"]
    again = post(live, "/completion", body).json()
    assert again["timings"]["cache_n"] == again["tokens_evaluated"] - 1                # all but the last token
    cold = post(live, "/completion", {**body, "cache_prompt": False}).json()
    assert cold["timings"]["cache_n"] == 0
    assert again["content"] == cold["content"] == first["content"]
    assert again["completion_probabilities"] == cold["completion_probabilities"]
    assert post(live, "/slots/1?action=save", {"filename": "x.bin"}).status_code == 400


# -- Jan --------------------------------------------------------------------------------------------------------
def test_jan_custom_provider(live):
    assert post(live, "/v1/models", method="GET").json()["data"][0]["object"] == "model"
    assert httpx.get(live.base + "/v1/models", timeout=30).status_code == 401         # Jan always sends its key
    body = {"model": "smollm2-135m-instruct-dflash", "messages": HI, "max_tokens": 12, "temperature": 0.7,
            "top_p": 0.95, "top_k": 20, "repeat_penalty": 1, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse(post(live, "/v1/chat/completions", body).text)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] >= 1
    assert usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]
