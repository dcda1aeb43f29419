"""The official `openai` and `ollama` Python clients against a running pyengine server
with the real SmolLM2."""

from __future__ import annotations

import json

import ollama
import openai
import pytest

from pyengine.server import ServerConfig
from server_support import running_server

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(ServerConfig(parallel=2, max_queue=8, n_ctx=1024)) as running:
        yield running


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oll(server):
    return ollama.Client(host=server.url, timeout=120)


# --------------------------------------------------------------------------------------
# openai
# --------------------------------------------------------------------------------------


def test_openai_chat(oai):
    reply = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, **GREEDY)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 6
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 6
    assert reply.model == MODEL and reply.id.startswith("chatcmpl-")


def test_openai_chat_streaming_with_usage(oai):
    whole = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, **GREEDY)
    stream = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_openai_tools_request_is_accepted(oai):
    reply = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=8, **GREEDY)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # A conversation that carries a call and its result renders too.
    follow_up = oai.chat.completions.create(model=MODEL, max_tokens=4, tools=[WEATHER_TOOL], **GREEDY, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ])
    assert follow_up.usage.completion_tokens == 4


def test_openai_json_response_format(oai, server):
    ask = [{"role": "user", "content": "Describe a cat as a JSON object."}]
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    formats = [{"type": "json_object"},
               {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}]
    oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1)  # make sure it is loaded
    for response_format in formats:
        reply = oai.chat.completions.create(model=MODEL, messages=ask, max_tokens=64,
                                            response_format=response_format, **GREEDY)
        content = reply.choices[0].message.content
        assert content.lstrip().startswith("{")
        if reply.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(content), dict)


def test_openai_extra_options_seed_and_stop(oai):
    extra = {"top_k": 20, "min_p": 0.05, "num_ctx": 512, "repeat_penalty": 1.1}
    first = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=1.0, seed=11,
                                        extra_body=extra)
    again = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=1.0, seed=11,
                                        extra_body=extra)
    assert first.choices[0].message.content == again.choices[0].message.content
    free = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, **GREEDY)
    text = free.choices[0].message.content
    stopped = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, stop=[text[3:5]], **GREEDY)
    assert stopped.choices[0].message.content == text[: text.index(text[3:5])]
    assert stopped.choices[0].finish_reason == "stop"


def test_openai_logprobs(oai, server):
    reply = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, logprobs=True,
                                        top_logprobs=2, **GREEDY)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == 3 and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)


def test_openai_completions(oai):
    reply = oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, **GREEDY)
    assert reply.object == "text_completion" and reply.choices[0].text
    assert reply.usage.completion_tokens == 4 and reply.choices[0].finish_reason == "length"
    echoed = oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, echo=True, **GREEDY)
    assert echoed.choices[0].text == "Once upon a time" + reply.choices[0].text
    pieces = list(oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == reply.choices[0].text
    assert pieces[-1].usage.completion_tokens == 4


def test_openai_models(oai):
    ids = [m.id for m in oai.models.list()]
    assert MODEL in ids
    assert oai.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")


def test_openai_errors_have_openai_shape(oai):
    with pytest.raises(openai.NotFoundError) as info:
        oai.chat.completions.create(model="no-such-model", messages=QUESTION)
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=QUESTION, temperature=5)
    assert info.value.body["param"] == "temperature"


# --------------------------------------------------------------------------------------
# ollama
# --------------------------------------------------------------------------------------


def test_ollama_generate(oll):
    reply = oll.generate(model=MODEL, prompt="What is the capital of France?",
                         options={"num_predict": 4, **GREEDY})
    assert reply.done and reply.done_reason == "length" and reply.response.strip()
    assert reply.eval_count == 4 and reply.prompt_eval_count > 4
    assert reply.context and len(reply.context) == reply.prompt_eval_count + 4
    streamed = list(oll.generate(model=MODEL, prompt="What is the capital of France?", stream=True,
                                 options={"num_predict": 4, **GREEDY}))
    assert "".join(part.response for part in streamed) == reply.response
    assert streamed[-1].done and not any(part.done for part in streamed[:-1])


def test_ollama_chat(oll):
    reply = oll.chat(model=MODEL, messages=QUESTION, options={"num_predict": 5, **GREEDY})
    assert reply.message.role == "assistant" and reply.message.content.strip()
    assert reply.eval_count == 5
    parts = list(oll.chat(model=MODEL, messages=QUESTION, stream=True, options={"num_predict": 5, **GREEDY}))
    assert "".join(p.message.content for p in parts) == reply.message.content
    assert parts[-1].done and parts[-1].done_reason == "length"
    # History: a second turn that includes the first reply.
    history = QUESTION + [{"role": "assistant", "content": reply.message.content},
                          {"role": "user", "content": "And of Spain?"}]
    second = oll.chat(model=MODEL, messages=history, options={"num_predict": 3, **GREEDY})
    assert second.prompt_eval_count > reply.prompt_eval_count


def test_ollama_list_show_ps(oll):
    names = [m.model for m in oll.list().models]
    assert f"{MODEL}:latest" in names
    shown = oll.show(MODEL)
    assert shown.details.family == "llama" and shown.details.format == "gguf"
    assert shown.modelinfo["general.architecture"] == "llama"
    assert "completion" in shown.capabilities and "im_start" in shown.template
    oll.generate(model=MODEL, prompt="Hi", options={"num_predict": 1})
    loaded = [m.model for m in oll.ps().models]
    assert f"{MODEL}:latest" in loaded
    assert oll._client.get("/api/version").json()["version"]


def test_ollama_errors(oll):
    with pytest.raises(ollama.ResponseError) as info:
        oll.chat(model="no-such-model", messages=QUESTION)
    assert info.value.status_code == 404 and "not found" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        oll.chat(model=MODEL, messages=QUESTION, options={"temperature": -1})
    assert info.value.status_code == 400 and "temperature" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        oll.generate(model=MODEL, prompt="x", options={"no_such_option": 1})
    assert info.value.status_code == 400 and "no_such_option" in info.value.error
