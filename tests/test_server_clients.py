"""The official `openai` and `ollama` Python clients against a running pyengine server
with the real SmolLM2 and Gemma-3-270M (one server serving both): the common paths for
each model, the rest with SmolLM2."""

from __future__ import annotations

import json

import numpy as np
import ollama
import openai
import pytest

from pyengine.server import ServerConfig
from server_support import running_server

MODEL = "smollm2-135m"
GEMMA = "gemma3-270m"
# What each model is (from its GGUF): architecture and embedding size.
FACTS = {MODEL: {"arch": "llama", "n_embd": 576}, GEMMA: {"arch": "gemma3", "n_embd": 640}}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def server(smollm2_path, gemma3_path):
    with running_server(ServerConfig(parallel=2, max_queue=8, n_ctx=1024)) as running:
        yield running


@pytest.fixture(scope="module", params=[MODEL, GEMMA])
def model(request):
    """Each model in turn (module scope: pytest runs all tests of one model, then the other)."""
    return request.param


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oll(server):
    return ollama.Client(host=server.url, timeout=120)


# --------------------------------------------------------------------------------------
# openai
# --------------------------------------------------------------------------------------


def test_openai_chat(oai, model):
    reply = oai.chat.completions.create(model=model, messages=QUESTION, max_tokens=6, **GREEDY)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 6
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 6
    assert reply.model == model and reply.id.startswith("chatcmpl-")


def test_openai_chat_streaming_with_usage(oai, model):
    whole = oai.chat.completions.create(model=model, messages=QUESTION, max_tokens=6, **GREEDY)
    stream = oai.chat.completions.create(model=model, messages=QUESTION, max_tokens=6, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_openai_tools_request_is_checked(oai):
    # SmolLM2's template never shows tools: letting it choose one is Ollama's 400
    with pytest.raises(openai.BadRequestError, match="does not support tools"):
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=8, **GREEDY)
    # A conversation that carries a call and its result renders (the tools hidden).
    follow_up = oai.chat.completions.create(model=MODEL, max_tokens=4, tools=[WEATHER_TOOL], tool_choice="none",
                                            **GREEDY, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ])
    assert follow_up.usage.completion_tokens == 4


def test_openai_json_response_format(oai, model):
    ask = [{"role": "user", "content": "Describe a cat as a JSON object."}]
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    formats = [{"type": "json_object"},
               {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}]
    oai.chat.completions.create(model=model, messages=QUESTION, max_tokens=1)  # make sure it is loaded
    for response_format in formats:
        reply = oai.chat.completions.create(model=model, messages=ask, max_tokens=64,
                                            response_format=response_format, **GREEDY)
        content = reply.choices[0].message.content
        assert content.lstrip().startswith("{")
        if reply.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(content), dict)


def test_openai_forced_tool_call(oai, model):
    weather = {"type": "function", "function": {**WEATHER_TOOL["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}}
    reply = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                        tools=[weather], tool_choice="required", max_tokens=64, **GREEDY)
    assert reply.choices[0].finish_reason == "tool_calls"
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")


def test_openai_embeddings(oai, model):
    texts = ["The cat sat on the mat.", "Stock prices fell sharply.", "The cat sat on the mat."]
    batch = oai.embeddings.create(model=model, input=texts)   # the client asks for base64 and decodes it
    vectors = np.asarray([item.embedding for item in batch.data])
    assert [item.index for item in batch.data] == [0, 1, 2]
    assert vectors.shape == (3, FACTS[model]["n_embd"])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(vectors[0], vectors[2])
    assert np.abs(vectors[0] - vectors[1]).max() > 1e-3
    single = oai.embeddings.create(model=model, input=texts[1], encoding_format="float")
    np.testing.assert_allclose(single.data[0].embedding, vectors[1], atol=1e-6)
    assert batch.usage.prompt_tokens > single.usage.prompt_tokens > 0 and batch.model == model


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


def test_openai_completions(oai, model):
    reply = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=4, **GREEDY)
    assert reply.object == "text_completion" and reply.choices[0].text
    assert reply.usage.completion_tokens == 4 and reply.choices[0].finish_reason == "length"
    echoed = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=4, echo=True, **GREEDY)
    assert echoed.choices[0].text == "Once upon a time" + reply.choices[0].text
    pieces = list(oai.completions.create(model=model, prompt="Once upon a time", max_tokens=4, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == reply.choices[0].text
    assert pieces[-1].usage.completion_tokens == 4


def test_openai_models(oai, model):
    ids = [m.id for m in oai.models.list()]
    assert model in ids
    assert oai.models.retrieve(model).id == model
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


def test_ollama_generate(oll, model):
    reply = oll.generate(model=model, prompt="What is the capital of France?",
                         options={"num_predict": 4, **GREEDY})
    assert reply.done and reply.done_reason == "length" and reply.response.strip()
    assert reply.eval_count == 4 and reply.prompt_eval_count > 4
    assert reply.context and len(reply.context) == reply.prompt_eval_count + 4
    streamed = list(oll.generate(model=model, prompt="What is the capital of France?", stream=True,
                                 options={"num_predict": 4, **GREEDY}))
    assert "".join(part.response for part in streamed) == reply.response
    assert streamed[-1].done and not any(part.done for part in streamed[:-1])


def test_ollama_chat(oll, model):
    reply = oll.chat(model=model, messages=QUESTION, options={"num_predict": 5, **GREEDY})
    assert reply.message.role == "assistant" and reply.message.content.strip()
    assert reply.eval_count == 5
    parts = list(oll.chat(model=model, messages=QUESTION, stream=True, options={"num_predict": 5, **GREEDY}))
    assert "".join(p.message.content for p in parts) == reply.message.content
    assert parts[-1].done and parts[-1].done_reason == "length"
    # History: a second turn that includes the first reply.
    history = QUESTION + [{"role": "assistant", "content": reply.message.content},
                          {"role": "user", "content": "And of Spain?"}]
    second = oll.chat(model=model, messages=history, options={"num_predict": 3, **GREEDY})
    assert second.prompt_eval_count > reply.prompt_eval_count


def test_ollama_list_show_ps(oll, model):
    names = [m.model for m in oll.list().models]
    assert f"{model}:latest" in names
    shown = oll.show(model)
    arch = FACTS[model]["arch"]
    assert shown.details.family == arch and shown.details.format == "gguf"
    assert shown.modelinfo["general.architecture"] == arch
    assert shown.modelinfo[f"{arch}.embedding_length"] == FACTS[model]["n_embd"]
    assert "completion" in shown.capabilities
    if model == GEMMA:  # Gemma-3-270M's GGUF carries no chat template: rendered in Gemma's turns
        assert "<start_of_turn>" in shown.template and "im_start" not in shown.template
    oll.generate(model=model, prompt="Hi", options={"num_predict": 1})
    loaded = [m.model for m in oll.ps().models]
    assert f"{model}:latest" in loaded
    assert oll._client.get("/api/version").json()["version"]


def test_ollama_embed(oll, model):
    reply = oll.embed(model=model, input=["The cat sat on the mat.", "Stock prices fell sharply."])
    assert len(reply.embeddings) == 2 and all(len(v) == FACTS[model]["n_embd"] for v in reply.embeddings)
    np.testing.assert_allclose(np.linalg.norm(reply.embeddings, axis=1), 1.0, atol=1e-5)
    assert reply.prompt_eval_count > 0 and reply.total_duration > 0
    legacy = oll.embeddings(model=model, prompt="The cat sat on the mat.")  # /api/embeddings: not normalised
    direction = np.asarray(legacy.embedding) / np.linalg.norm(legacy.embedding)
    np.testing.assert_allclose(direction, reply.embeddings[0], atol=1e-5)
    with pytest.raises(ollama.ResponseError) as info:
        oll.embed(model="no-such-model", input="x")
    assert info.value.status_code == 404


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
