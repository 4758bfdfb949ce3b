"""Request validation (applied, harmless, neutral-only, refused) and the reasoning / tool-call splitter."""

import json

import pytest

from dflash_gguf.engine.loop import GenerationResult
from dflash_gguf.server.chat_output import OutputSplitter
from dflash_gguf.server.protocol import BadRequest, parse_chat, parse_completion
from dflash_gguf.server.worker import timings

USER = [{"role": "user", "content": "hi"}]


def test_applied_parameters_reach_the_request():
    r = parse_chat({"model": "x", "user": "u", "messages": USER, "temperature": 0.3, "top_p": 0.9, "top_k": 20,
                    "min_p": 0.05, "max_completion_tokens": 7, "max_tokens": 99, "stop": "END", "seed": 5,
                    "stream": True, "stream_options": {"include_usage": True},
                    "chat_template_kwargs": {"enable_thinking": False}})
    s = r.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0.3, 0.9, 20, 0.05, 5)
    assert r.max_tokens == 7 and r.stop == ["END"] and r.stream and r.include_usage
    assert r.enable_thinking is False and r.tools is None
    c = parse_completion({"prompt": ["t5 t6"], "max_tokens": -1, "seed": -1})
    assert c.prompt == "t5 t6" and c.max_tokens is None and c.sampling.seed is None
    assert parse_completion({"prompt": [[5, 6, 7]]}).prompt == [5, 6, 7]


@pytest.mark.parametrize("extra, param", [
    ({"logit_bias": {"1": 2}}, "logit_bias"), ({"n": 2}, "n"), ({"presence_penalty": 0.7}, "presence_penalty"),
    ({"frequency_penalty": 0.1}, "frequency_penalty"), ({"repeat_penalty": 1.1}, "repeat_penalty"),
    ({"logprobs": True}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"), ({"functions": []}, "functions"),
    ({"tool_choice": "required", "tools": []}, "tool_choice"), ({"mirostat": 2}, "mirostat"),
    ({"chat_template_kwargs": {"reasoning_effort": "low"}}, "chat_template_kwargs"),
    ({"stream_options": {"include_obfuscation": True}}, "stream_options"),
    ({"temperature": 3}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"),
    ({"top_k": 2.5}, "top_k"), ({"stop": ["a"] * 17}, "stop"), ({"stream": "yes"}, "stream"),
])
def test_unsupported_or_invalid_parameters_are_refused_by_name(extra, param):
    with pytest.raises(BadRequest) as e:
        parse_chat({"messages": USER, **extra})
    assert e.value.param == param and param in str(e.value)


@pytest.mark.parametrize("field, flag, value, allowed", [("top_p", "--top-p", 1.5, "must be in (0, 1]"),
                                                         ("top_p", "--top-p", 0.0, "must be in (0, 1]"),
                                                         ("min_p", "--min-p", 2.0, "must be in [0, 1]")])
def test_one_sampling_range_refuses_alike_in_run_and_both_servers(field, flag, value, allowed):
    """engine/sampling.py's table: run's options, the OpenAI and the llama-server bodies name the same range."""
    from dflash_gguf.engine.commands import check_sampling_options
    from dflash_gguf.errors import UserError
    from dflash_gguf.server.llama_protocol import parse_completion as parse_native
    for parse in (lambda: parse_chat({"messages": USER, field: value}),
                  lambda: parse_native({"prompt": "hi", field: value})):
        with pytest.raises(BadRequest) as e:
            parse()
        assert e.value.param == field and str(e.value).startswith(f"{field} {value}: {allowed}")
    sampling = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, field: value}
    with pytest.raises(UserError, match=f"^{flag} {value}: " + allowed.replace("(", r"\(").replace("[", r"\[")):
        check_sampling_options(8, 1.0, seed=None, **sampling)


def test_neutral_values_are_accepted():
    parse_chat({"messages": USER, "n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "repeat_penalty": 1.0,
                "logprobs": False, "top_logprobs": None, "logit_bias": {}, "response_format": {"type": "text"},
                "cache_prompt": True, "store": False, "parallel_tool_calls": True, "reasoning_format": "auto"})
    with pytest.raises(BadRequest, match="logprobs"):
        parse_completion({"prompt": "x", "logprobs": 0})      # 0 asks for the chosen tokens' logprobs


def test_messages_are_normalised_for_templates():
    r = parse_chat({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]})
    m = r.messages
    assert m[0] == {"role": "system", "content": "be brief"} and m[1]["content"] == "ab"
    assert m[2]["content"] == "" and m[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert m[3]["tool_call_id"] == "c1"
    with pytest.raises(BadRequest, match="image_url"):
        parse_chat({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    with pytest.raises(BadRequest, match="role"):
        parse_chat({"messages": [{"role": "wizard", "content": "x"}]})
    with pytest.raises(BadRequest, match="prompt"):
        parse_completion({"prompt": ["a", "b"]})


def feed_all(s: OutputSplitter, pieces):
    deltas = [s.feed(p) for p in pieces] + [s.feed("", final=True)]
    return ("".join(d.content for d in deltas), "".join(d.reasoning for d in deltas),
            [c for d in deltas for c in d.tool_calls])


def test_reasoning_and_tool_calls_split_across_pieces():
    text = '<think>\nplan it\n</think>\n\nOk. <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    for cut in (1, 2, 3, 5, 7):                   # tags cut at every position
        s = OutputSplitter(tools=True)
        content, reasoning, calls = feed_all(s, [text[i:i + cut] for i in range(0, len(text), cut)])
        assert reasoning == "plan it\n" and content == "Ok. "
        assert [c["function"] for c in calls] == [{"name": "f", "arguments": '{"x": 1}'}]
        assert s.tool_calls == calls and calls[0]["id"].startswith("call_")


def test_template_opened_think_parallel_calls_and_bad_json():
    s = OutputSplitter(thinking=True, tools=True)
    content, reasoning, calls = feed_all(s, ["I should call g.</thi", "nk>",
                                             '<tool_call>{"name": "g", "parameters": {}}</tool_call>',
                                             '<tool_call>{"name": "h", "arguments": "{}"}</tool_call>'])
    assert reasoning == "I should call g." and content == ""
    assert [c["function"]["name"] for c in calls] == ["g", "h"] and calls[0]["function"]["arguments"] == "{}"
    one = OutputSplitter(tools=True, max_tool_calls=1)
    assert len(feed_all(one, ['<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}</tool_call>'])[2]) == 1
    bad = OutputSplitter(tools=True)
    content, _, calls = feed_all(bad, ["<tool_call>not json</tool_call> done"])
    assert not calls and content == "<tool_call>not json</tool_call> done"
    unclosed = OutputSplitter(tools=True)                 # the model stopped before the closing tag
    assert feed_all(unclosed, ['<tool_call>{"name": "z", "arguments": {}}'])[2][0]["function"]["name"] == "z"


def test_tags_are_plain_text_where_they_do_not_apply():
    no_tools = OutputSplitter(tools=False)
    assert feed_all(no_tools, ["<tool_call>{}</tool_call>"])[0] == "<tool_call>{}</tool_call>"
    late = OutputSplitter()                                   # only a leading think block is reasoning
    assert feed_all(late, ["Use <think> tags like <think>x</think>."]) == \
        ("Use <think> tags like <think>x</think>.", "", [])
    raw = OutputSplitter(thinking=True, parse_reasoning=False)  # reasoning_format "none"
    assert feed_all(raw, ["a</think>b"])[0] == "<think>a</think>b"


def test_timings_carry_draft_counts_like_llama_server():
    r = GenerationResult(tokens=[1, 2, 3, 4, 5], n_prompt=7, n_target_calls=2, n_drafted=6, n_accepted=2)
    r.timings.prefill_s, r.timings.total_s = 0.5, 1.5
    t = timings(r)
    assert {k: t[k] for k in ("prompt_n", "predicted_n", "draft_n", "draft_n_accepted")} == \
        {"prompt_n": 7, "predicted_n": 5, "draft_n": 6, "draft_n_accepted": 2}
    assert t["tau"] == 2.0 and t["predicted_per_second"] == 4.0 and t["prompt_ms"] == 500.0
    json.dumps(t)
