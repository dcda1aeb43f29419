"""The chat API (pyengine.session): rendering, generation, parsing and the
Ollama/OpenAI shapes, on the real SmolLM2 and on scripted generations."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from pyengine import session
from pyengine.chat.messages import normalize_messages, normalize_tools
from pyengine.chat.shapes import OllamaShaper, OpenAIChatShaper
from pyengine.errors import ContextLengthError, InvalidOptionError, UnsupportedError
from pyengine.generation import TextChunk
from pyengine.runner.sequence import Completion

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}},
                                                                "required": ["city"]}}}


@pytest.fixture(scope="module")
def llm(smollm2_path):
    from pyengine.api import LLM

    model = LLM(str(smollm2_path), n_ctx=1024)
    yield model
    close = getattr(model, "close", None)
    if callable(close):
        close()


def chat_fn(llm):
    """LLM.chat once the lead attaches it; the session function until then."""
    method = getattr(llm, "chat", None)
    return method if callable(method) else (lambda *a, **k: session.chat(llm, *a, **k))


# --------------------------------------------------------------------------------------
# Real model
# --------------------------------------------------------------------------------------


def test_chat_whole_and_streamed_agree(llm):
    chat = chat_fn(llm)
    whole = chat(QUESTION, num_predict=6, temperature=0)
    assert whole["done"] is True and whole["done_reason"] == "length"
    assert whole["message"]["role"] == "assistant" and whole["message"]["content"].strip()
    assert whole["eval_count"] == 6
    assert whole["prompt_eval_count"] == len(session.prepare_chat(llm, QUESTION).ids)
    chunks = list(chat(QUESTION, num_predict=6, temperature=0, stream=True))
    assert [c["done"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c["message"]["content"] for c in chunks) == whole["message"]["content"]
    assert chunks[-1]["eval_count"] == 6


def test_create_chat_completion_shapes(llm):
    reply = session.create_chat_completion(llm, QUESTION, max_tokens=5, temperature=0)
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    [choice] = reply["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    usage = reply["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    chunks = list(session.create_chat_completion(llm, QUESTION, max_tokens=5, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == choice["message"]["content"]


def test_stop_string_and_seeded_sampling(llm):
    chat = chat_fn(llm)
    free = chat(QUESTION, num_predict=8, temperature=0)["message"]["content"]
    cut = free[2:4]
    stopped = chat(QUESTION, num_predict=8, temperature=0, stop=[cut])
    assert stopped["message"]["content"] == free[: free.index(cut)]
    assert stopped["done_reason"] == "stop"
    a = chat(QUESTION, num_predict=6, temperature=1.0, seed=7)["message"]["content"]
    b = chat(QUESTION, num_predict=6, temperature=1.0, seed=7)["message"]["content"]
    assert a == b


def test_a_reply_stops_at_the_last_resort_chatml_tags(gemma3_path):
    """A model rendered with ChatML, the last resort for files without a template, whose
    vocabulary lacks ChatML's tokens (Gemma-3-270M, forced onto it here: its own renderer
    is Gemma's) writes the closing tag as text. The reply ends there, as the same prompt
    run raw shows it would not."""
    from pyengine.api import LLM
    from pyengine.chat.template import ChatTemplate

    messages = [{"role": "user", "content": "Tell me a joke"}]
    with LLM(str(gemma3_path), n_ctx=512, n_parallel=1) as gemma:
        session._TEMPLATES[gemma] = ChatTemplate.fallback(bos_token="<bos>", eos_token="<eos>")
        raw = gemma.generate(session.chat_template(gemma).render(messages), max_tokens=40, temperature=0)
        assert "<|im_end|>" in raw
        for stop in (None, "no such text"):
            reply = gemma.chat(messages, num_predict=40, stop=stop, temperature=0)
            assert reply["message"]["content"] == raw[: raw.index("<|im_end|>")]
            assert reply["done_reason"] == "stop" and reply["eval_count"] < 40


def test_cancel_stops_the_generation(llm):
    run = session.start_chat(llm, QUESTION, num_predict=400, temperature=0)
    events = iter(run)
    next(events)
    started = time.monotonic()
    run.cancel()
    rest = list(events)
    assert isinstance(rest[-1], session.ChatResult)
    assert rest[-1].finish_reason == "cancelled"
    assert rest[-1].completion_tokens < 100
    assert time.monotonic() - started < 10
    # The model is free again at once.
    assert chat_fn(llm)(QUESTION, num_predict=2, temperature=0)["eval_count"] == 2


def test_prompt_longer_than_the_context(llm):
    long_question = [{"role": "user", "content": "word " * 300}]
    with pytest.raises(ContextLengthError, match="context"):
        session.chat(llm, long_question, num_ctx=64, num_predict=1)
    with pytest.raises(InvalidOptionError, match="num_ctx"):
        session.chat(llm, QUESTION, num_ctx=10**6, num_predict=1)


def test_max_tokens_is_num_predict_by_its_openai_name(llm):
    """chat() takes llama-cpp-python's and OpenAI's max_tokens for Ollama's num_predict;
    both at once is an error that names them."""
    assert chat_fn(llm)(QUESTION, max_tokens=3, temperature=0)["eval_count"] == 3
    with pytest.raises(InvalidOptionError, match="num_predict or max_tokens"):
        session.chat(llm, QUESTION, max_tokens=3, num_predict=4)
    with pytest.raises(InvalidOptionError, match="max_tokens"):
        session.chat(llm, QUESTION, max_tokens="three")


def test_bad_options_raise_before_generating(llm):
    with pytest.raises(InvalidOptionError, match="no_such_option"):
        session.chat(llm, QUESTION, no_such_option=1)
    with pytest.raises(InvalidOptionError, match="temperature"):
        session.chat(llm, QUESTION, temperature=-1)
    with pytest.raises(InvalidOptionError, match="num_predict"):
        session.chat(llm, QUESTION, num_predict="ten")
    with pytest.raises(InvalidOptionError):
        session.chat(llm, [], num_predict=1)


def test_tools_are_refused_by_a_template_without_tools(llm):
    # SmolLM2's template never shows the tools: asking it to choose one is refused, as Ollama does.
    prepared = session.prepare_chat(llm, QUESTION, tools=[WEATHER_TOOL])
    assert prepared.tool_format is None
    with pytest.raises(InvalidOptionError, match='"smollm2-135m" does not support tools'):
        session.create_chat_completion(llm, QUESTION, tools=[WEATHER_TOOL], tool_choice="auto",
                                       max_tokens=3, temperature=0)


def test_json_format(llm):
    fmt = {"type": "json_object"}
    reply = session.create_chat_completion(
        llm, [{"role": "user", "content": "Give me a JSON object with a name."}],
        response_format=fmt, max_tokens=48, temperature=0)
    content = reply["choices"][0]["message"]["content"]
    if reply["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert content.lstrip().startswith("{")


def test_token_ids_and_raw_prompts(llm):
    prepared = session.prepare_prompt(llm, "Hello")
    assert prepared.parse is False and prepared.ids == llm.tokenize("Hello", parse_special=True)
    with pytest.raises(InvalidOptionError, match="token"):
        session.prepare_prompt(llm, [1, -5])
    with pytest.raises(InvalidOptionError, match="empty"):
        session.prepare_prompt(llm, [])
    result = session.start_prepared(llm, session.prepare_prompt(llm, prepared.ids), num_predict=3).collect()
    assert result.completion_tokens == 3 and result.prompt_tokens == len(prepared.ids)


# --------------------------------------------------------------------------------------
# Scripted generations: parsing and shapes
# --------------------------------------------------------------------------------------


class ScriptedHandle:
    """A generation handle that plays back fixed text pieces."""

    def __init__(self, pieces, finish_reason="stop"):
        self.events = [TextChunk(p) for p in pieces]
        self.events.append(Completion(text="".join(pieces), tokens=list(range(len(pieces))),
                                      finish_reason=finish_reason, prompt_tokens=4))
        self.cancelled = False

    def cancel(self):
        self.cancelled = True

    def __iter__(self):
        return iter(self.events)


def scripted(pieces, tool_format=None, starts_in_reasoning=False):
    prepared = session.PreparedPrompt([1, 2, 3, 4], "prompt", tool_format, starts_in_reasoning)
    return session.ChatStream(ScriptedHandle(pieces), prepared)


TOOL_PIECES = ["<tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}",
               "\n</tool_call>"]


def test_tool_call_becomes_tool_calls_entry():
    result = scripted(TOOL_PIECES, tool_format="hermes").collect()
    assert result.finish_reason == "tool_calls" and result.content == ""
    [call] = result.tool_calls
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    reply = OpenAIChatShaper("m").response(result)
    message = reply["choices"][0]["message"]
    assert message["content"] is None and message["tool_calls"][0]["type"] == "function"
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    ollama = OllamaShaper("m").final(result, streamed=False)
    assert ollama["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert ollama["done_reason"] == "stop"


def test_tool_call_streamed():
    shaper = OpenAIChatShaper("m")
    chunks = [shaper.chunk(e) for e in scripted(TOOL_PIECES, tool_format="hermes")
              if isinstance(e, session.ChatPiece)]
    calls = [c["choices"][0]["delta"]["tool_calls"] for c in chunks if c and "tool_calls" in c["choices"][0]["delta"]]
    assert len(calls) == 1 and calls[0][0]["index"] == 0
    assert json.loads(calls[0][0]["function"]["arguments"]) == {"city": "Paris"}
    assert not any(c and c["choices"][0]["delta"].get("content") for c in chunks)


def test_tool_text_without_tools_is_content():
    result = scripted(TOOL_PIECES, tool_format=None).collect()
    assert result.tool_calls == [] and "<tool_call>" in result.content and result.finish_reason == "stop"


def test_reasoning_is_split_from_content():
    result = scripted(["<th", "ink>Let me see.</think>", "\n\nParis."]).collect()
    assert (result.reasoning, result.content) == ("Let me see.", "Paris.")
    message = OpenAIChatShaper("m").response(result)["choices"][0]["message"]
    assert message["reasoning_content"] == "Let me see." and message["content"] == "Paris."
    assert OllamaShaper("m").final(result, streamed=False)["message"]["thinking"] == "Let me see."
    opened = scripted(["still thinking</think>Done"], starts_in_reasoning=True).collect()
    assert (opened.reasoning, opened.content) == ("still thinking", "Done")


def test_stream_stopped_early_cancels_its_handle():
    run = scripted(["a", "b", "c"])
    events = iter(run)
    next(events)
    events.close()
    assert run._handle.cancelled


# --------------------------------------------------------------------------------------
# Messages, tools, think, response_format, tool_choice
# --------------------------------------------------------------------------------------


def test_messages_are_normalized():
    messages = normalize_messages([
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny.", "thinking": "easy"},
    ])
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[2]["content"] == "" and messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert messages[3]["tool_call_id"] == "call_1"
    assert messages[4]["reasoning_content"] == "easy"


@pytest.mark.parametrize("messages, error", [
    ("hello", InvalidOptionError),
    ([], InvalidOptionError),
    ([{"content": "no role"}], InvalidOptionError),
    ([{"role": "user", "content": 5}], InvalidOptionError),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], UnsupportedError),
    ([{"role": "user", "content": "x", "images": ["abc"]}], UnsupportedError),
    ([{"role": "assistant", "tool_calls": [{"function": {}}]}], InvalidOptionError),
])
def test_bad_messages(messages, error):
    with pytest.raises(error):
        normalize_messages(messages)


def test_tools_are_checked():
    assert normalize_tools(None) is None
    assert normalize_tools([WEATHER_TOOL])[0]["function"]["name"] == "get_weather"
    for bad in ("x", [1], [{"type": "function"}], [{"type": "function", "function": {"name": ""}}]):
        with pytest.raises(InvalidOptionError):
            normalize_tools(bad)


QWEN3_LIKE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}"
    "{%- endif %}"
)


def test_think_switches_the_template(llm):
    fake = SimpleNamespace(gguf=SimpleNamespace(get_str=lambda key, default="": QWEN3_LIKE),
                           tokenizer=llm.tokenizer)
    off = session.prepare_chat(fake, QUESTION, think=False)
    on = session.prepare_chat(fake, QUESTION, think=True)
    default = session.prepare_chat(fake, QUESTION)
    assert off.text.endswith("assistant<think>\n\n</think>")
    assert on.text.endswith("assistant") and default.text == on.text
    assert session.prepare_chat(fake, QUESTION, think="high").text == on.text
    with pytest.raises(InvalidOptionError, match="think"):
        session.prepare_chat(fake, QUESTION, think="very")


def test_response_format_and_tool_choice_mapping():
    fmt = session.response_format_to_format
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert fmt(None) is None and fmt({"type": "text"}) is None
    assert fmt({"type": "json_object"}) == "json"
    assert fmt({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}) == schema
    for bad in ({"type": "xml"}, "json", {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": 3}}):
        with pytest.raises(InvalidOptionError):
            fmt(bad)
    tools = [WEATHER_TOOL]
    assert session.apply_tool_choice(tools, "none") is None
    assert session.apply_tool_choice(tools, "auto") is tools
    assert session.apply_tool_choice(tools, {"type": "function", "function": {"name": "get_weather"}}) is tools
    with pytest.raises(InvalidOptionError):
        session.apply_tool_choice(tools, "sometimes")
