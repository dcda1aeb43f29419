"""gpt-oss's harmony format: its chat template rendered as transformers renders it
(tests/data/harmony/goldens.json, scripts/record_harmony_goldens.py), replies split into
reasoning, tool calls and content (whole, streamed in any split, malformed), and the
Ollama, OpenAI and Responses chat routes serving a scripted harmony reply."""

from __future__ import annotations

import json
import random
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from server_support import FakeAdapter, fake_loader, running_server

from pyengine import session
from pyengine.chat import sandbox
from pyengine.chat.capabilities import template_capabilities
from pyengine.chat.harmony import (
    FINAL_OPENER,
    HARMONY_STOPS,
    MAX_HEADER_CHARS,
    HarmonyParser,
    Header,
    harmony_call_header,
    is_harmony_template,
    opened_header,
    read_header,
)
from pyengine.chat.messages import normalize_messages, normalize_tools
from pyengine.chat.parsers import (
    Delta,
    StreamParser,
    collect,
    detect_tool_format,
    make_parser,
    parse_output,
    reply_format,
)
from pyengine.chat.template import takes_reasoning_effort
from pyengine.errors import InvalidOptionError
from pyengine.runner.sequence import Completion
from pyengine.server import ServerConfig
from pyengine.server.models import ModelAdapter
from pyengine.tokenizer.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "harmony" / "goldens.json").read_text())
SOURCE = (DATA / "harmony" / GOLDEN["template"]).read_text()
OTHER_TEMPLATES = json.loads((DATA / "templates_golden.json").read_text())["templates"]


# --------------------------------------------------------------------------------------
# Rendering: the template as transformers renders it
# --------------------------------------------------------------------------------------


class _GoldenDate(datetime):
    """The day the goldens were rendered on (the template writes "Current date")."""

    @classmethod
    def now(cls, tz=None):
        return datetime.strptime(GOLDEN["date"], "%Y-%m-%d")


@pytest.fixture()
def golden_date(monkeypatch):
    monkeypatch.setattr(sandbox, "datetime", _GoldenDate)


class _Tokenizer:
    bos_id = eos_id = None
    vocab = SimpleNamespace(special={})

    def encode(self, text, add_special=True, parse_special=False):
        return [len(text)]   # one "token" per text: tells which texts were encoded


def harmony_llm(source: str = SOURCE) -> SimpleNamespace:
    """Just enough of an LLM for session.prepare_chat: a file with gpt-oss's template."""
    metadata = {"general.architecture": "gpt-oss", "tokenizer.chat_template": source}
    gguf = SimpleNamespace(path="gpt-oss-test.gguf", architecture="gpt-oss", metadata=metadata,
                           get_str=lambda key, default="": metadata.get(key, default))
    return SimpleNamespace(gguf=gguf, tokenizer=_Tokenizer(), path="gpt-oss-test.gguf", n_vocab=16)


def _rendered_by_pyengine(case: dict) -> str:
    llm = harmony_llm()
    if case["add_generation_prompt"] and not case["extra"]:
        # the chat routes' path: client messages normalized, `think` mapped, generation prompt
        return session.prepare_chat(llm, case["client"], tools=case["tools"], think=case["think"]).text
    template = session.chat_template(llm)
    return template.render(normalize_messages(case["client"]), tools=normalize_tools(case["tools"]),
                           add_generation_prompt=case["add_generation_prompt"], **case["extra"], **case["kwargs"])


def test_goldens_cover_the_template_features():
    cases = GOLDEN["cases"].values()
    texts = "".join(case["text"] for case in cases)
    for feature in ("Reasoning: low", "Reasoning: medium", "Reasoning: high", "<|start|>developer<|message|>",
                    "namespace functions {", "type get_location = () => any;", "namespace browser {",
                    "to=functions.get_weather<|channel|>commentary json", "<|start|>functions.get_weather to=assistant",
                    "<|channel|>analysis<|message|>Need the weather tool.", "<|return|>", "東京"):
        assert feature in texts, feature
    multi = GOLDEN["cases"]["ollama_multi_turn_drops_reasoning"]["text"]
    assert "A greeting." not in multi and "Call the tool." not in multi   # earlier reasoning dropped
    assert len(GOLDEN["cases"]) == 8


@pytest.mark.parametrize("name", GOLDEN["cases"])
def test_renders_as_transformers(name, golden_date):
    case = GOLDEN["cases"][name]
    assert _rendered_by_pyengine(case) == case["text"]


def test_think_maps_onto_reasoning_effort(golden_date):
    llm = harmony_llm()
    ask = [{"role": "user", "content": "Hi"}]
    for think, effort in ((None, "medium"), (True, "medium"), (False, "low"), ("low", "low"), ("high", "high")):
        assert f"\nReasoning: {effort}\n" in session.prepare_chat(llm, ask, think=think).text, think
    with pytest.raises(InvalidOptionError):
        session.prepare_chat(llm, ask, think="max")


def test_the_template_is_read_as_harmony():
    prepared = session.prepare_chat(harmony_llm(), [{"role": "user", "content": "Hi"}])
    assert prepared.tool_format == "harmony" and prepared.stops == HARMONY_STOPS
    assert not prepared.starts_in_reasoning
    assert is_harmony_template(SOURCE) and detect_tool_format(SOURCE) == "harmony"
    assert reply_format(SOURCE, has_tools=False) == reply_format(SOURCE, has_tools=True) == "harmony"
    assert template_capabilities(SOURCE) == ("tools", "thinking")
    assert takes_reasoning_effort(SOURCE)
    assert not takes_reasoning_effort(OTHER_TEMPLATES["Qwen-Qwen3-0.6B.jinja"]["source"])
    assert isinstance(make_parser(tool_format="harmony"), HarmonyParser)
    assert not any(is_harmony_template(record["source"]) for record in OTHER_TEMPLATES.values())
    assert reply_format(OTHER_TEMPLATES["Qwen-Qwen3-0.6B.jinja"]["source"], has_tools=False) is None
    with pytest.raises(InvalidOptionError):
        StreamParser(tool_format="harmony")


# --------------------------------------------------------------------------------------
# Replies: channels into reasoning, tool calls and content
# --------------------------------------------------------------------------------------


def call(name: str, arguments: dict) -> dict:
    return {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


# A gpt-oss reply as openai/harmony records it (test-data/test_streamable_parser.txt, up to
# the end of the model's turn): reasoning, then a call of the built-in browser tool.
RECORDED = (
    '<|channel|>analysis<|message|>User asks "Who is the current US president?" It\'s 2025, presumably current '
    "president is Joe Biden? Actually as of 2025-07-28, there was a 2024 election. In 2024, President is probably "
    "President Biden still? But we need up to date info. Let's browse to confirm.<|end|><|start|>assistant"
    '<|channel|>commentary to=browser.search code<|message|>{"query": "current US president July 2025", "topn": 10, '
    '"source": "news"}<|call|>'
)
# Reasoning, a preamble, a function call and a final answer, markers as the tokenizer renders them.
FULL = (
    "<|channel|>analysis<|message|>The user wants the weather in Paris. Use get_weather.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking the forecast.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
    '{"city": "Paris", "unit": "celsius"}<|call|>'
    "<|start|>assistant<|channel|>final<|message|>It is 18 °C in Paris.<|return|>"
)

# (reply, parser options, content, reasoning, calls)
CASES = {
    "recorded": (RECORDED, {}, "", RECORDED[30:RECORDED.index("<|end|>")],
                 [call("browser.search", {"query": "current US president July 2025", "topn": 10, "source": "news"})]),
    "full reply": (FULL, {}, "Checking the forecast.It is 18 °C in Paris.",
                   "The user wants the weather in Paris. Use get_weather.",
                   [call("get_weather", {"city": "Paris", "unit": "celsius"})]),
    "final only, <|return|> not in the text": ("<|channel|>final<|message|>Hello!", {}, "Hello!", None, []),
    "call ended by the generation (<|call|> is end-of-generation)": (
        ('<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary '
         'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}'),
        {}, "", "Need it.", [call("get_weather", {"city": "Oslo"})]),
    "recipient before the channel": (
        '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": [1, {"b": "}"}]}<|call|>',
        {}, "", None, [call("f", {"a": [1, {"b": "}"}]})]),
    "no arguments": ("<|channel|>commentary to=functions.get_location<|message|><|call|>", {}, "", None,
                     [call("get_location", {})]),
    "reasoning off puts analysis in the content": (
        "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Yes.",
        {"reasoning": False}, "Hm.Yes.", None, []),
    "whitespace kept inside bodies, dropped between messages": (
        "<|channel|>analysis<|message|> a \n<|end|>\n\n<|start|>assistant<|channel|>final<|message|>\n b ",
        {}, "\n b ", " a \n", []),
    "empty": ("", {}, "", None, []),
    # malformed: degrades to content, never raises
    "not harmony at all": ("Hello there, <b>friend</b>.", {}, "Hello there, <b>friend</b>.", None, []),
    "missing <|message|>": ("<|channel|>final Hello world", {}, "<|channel|>final Hello world", None, []),
    "missing <|message|>, cut by a terminator": (
        "<|channel|>analysis thinking<|end|>Then text.", {}, "<|channel|>analysis thinkingThen text.", None, []),
    "header with a newline": ("<|channel|>final\nHello<|message|>x", {}, "<|channel|>final\nHello<|message|>x",
                              None, []),
    "header too long": ("<|channel|>" + "x" * MAX_HEADER_CHARS + "<|message|>y", {},
                        "<|channel|>" + "x" * MAX_HEADER_CHARS + "<|message|>y", None, []),
    "header cut off by the end of the reply": ("<|channel|>analy", {}, "", None, []),
    "unknown channel": (("<|channel|>scratchpad<|message|>notes<|end|><|start|>assistant<|channel|>final"
                         "<|message|> Done."), {}, "notes Done.", None, []),
    "unterminated analysis": ("<|channel|>analysis<|message|>still thinking", {}, "", "still thinking", []),
    "call with bad JSON": ("<|channel|>commentary to=functions.f json<|message|>{bad}<|call|>", {},
                           "<|channel|>commentary to=functions.f json<|message|>{bad}", None, []),
    "call arguments not an object": ("<|channel|>commentary to=functions.f<|message|>[1, 2]", {},
                                     "<|channel|>commentary to=functions.f<|message|>[1, 2]", None, []),
    "unterminated call": ('<|channel|>commentary to=functions.f json<|message|>{"a": ', {},
                          '<|channel|>commentary to=functions.f json<|message|>{"a": ', None, []),
    "a role that is not the assistant's": ("<|end|><|start|>user<|message|>hi<|end|>", {},
                                           "<|start|>user<|message|>hi", None, []),
    "stray terminators": ("<|return|><|end|>", {}, "", None, []),
    "a new header ends an unclosed body": (
        "<|channel|>analysis<|message|>Hm<|channel|>final<|message|>Ok", {}, "Ok", "Hm", []),
}


def summary(parsed) -> tuple:
    """A parse result without the random call ids."""
    return parsed.content, parsed.reasoning, [tool_call["function"] for tool_call in parsed.tool_calls]


def stream(pieces: list[str], options: dict) -> list[Delta]:
    parser = make_parser(tool_format="harmony", **options)
    deltas: list[Delta] = []
    for piece in pieces:
        deltas += parser.push(piece)
    return deltas + parser.finish()


def every_split(text: str) -> list[list[str]]:
    """All splits into 2 pieces, every split into 3 around the markers, and single characters."""
    splits = [[text[:cut], text[cut:]] for cut in range(len(text) + 1)] + [list(text)]
    marks = sorted({i for i in range(len(text)) if text[i] in "<|>"})
    splits += [[text[:a], text[a:b], text[b:]] for a in marks for b in marks if a < b]
    return splits


@pytest.mark.parametrize("name", CASES)
def test_one_shot(name):
    text, options, content, reasoning, calls = CASES[name]
    parsed = parse_output(text, tool_format="harmony", **options)
    assert summary(parsed) == (content, reasoning, calls)
    assert all(tool_call["type"] == "function" and tool_call["id"].startswith("call_")
               for tool_call in parsed.tool_calls)


@pytest.mark.parametrize("name", CASES)
def test_every_split_adds_up_to_one_shot(name):
    text, options, *_ = CASES[name]
    expected = summary(parse_output(text, tool_format="harmony", **options))
    for pieces in every_split(text):
        assert summary(collect(stream(pieces, options))) == expected, pieces


def test_token_pieces_as_generated():
    """The markers as whole tokens, the words between in small pieces."""
    pieces = []
    for chunk in FULL.replace("<|", "\0<|").replace("|>", "|>\0").split("\0"):
        pieces += [chunk] if chunk.startswith("<|") else [chunk[i:i + 3] for i in range(0, len(chunk), 3)]
    deltas = stream(pieces, {})
    assert summary(collect(deltas)) == CASES["full reply"][2:]
    kinds = [delta.kind for delta in deltas]
    assert kinds.count("tool_call") == 1 and kinds.index("reasoning") < kinds.index("tool_call")


def test_random_replies_stream_like_one_shot():
    fragments = ["<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary", " to=functions.f",
                 " to=browser.search", " <|constrain|>json", " json", "<|message|>", "<|end|>", "<|call|>",
                 "<|return|>", '{"a": 1}', "{", "}", "hi ", "\n", " ", "<|", "|>", "<|chan", "x" * 40]
    rng = random.Random(28)
    for _ in range(600):
        text = "".join(rng.choice(fragments) for _ in range(rng.randint(1, 12)))
        options = {"reasoning": rng.random() < 0.8}
        expected = summary(parse_output(text, tool_format="harmony", **options))
        cuts = sorted(rng.sample(range(len(text) + 1), min(4, len(text) + 1)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert summary(collect(stream(pieces, options))) == expected, (text, pieces)
        assert summary(collect(stream(list(text), options))) == expected, text


def test_text_is_emitted_as_soon_as_it_is_certain():
    parser = HarmonyParser()
    assert parser.push("<|channel|>analysis<|mess") == []
    assert not parser.in_reasoning
    assert parser.push("age|>Let me th") == [Delta("reasoning", "Let me th")]
    assert parser.in_reasoning
    assert parser.push("ink.<|en") == [Delta("reasoning", "ink.")]   # "<|en" may be <|end|>
    assert parser.push("d|><|start|>assistant<|channel|>final<|message|>Sun") == [Delta("content", "Sun")]
    assert not parser.in_reasoning
    assert parser.push("ny.") == [Delta("content", "ny.")]
    assert parser.finish() == []
    with pytest.raises(InvalidOptionError):
        parser.push("late")
    with pytest.raises(InvalidOptionError):
        HarmonyParser().push(b"bytes")  # type: ignore[arg-type]


def test_a_call_is_emitted_whole_when_its_message_ends():
    parser = HarmonyParser()
    assert parser.push('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": ') == []
    assert parser.push("2}") == []
    (delta,) = parser.push("<|call|>")
    assert delta.kind == "tool_call" and delta.tool_call["function"] == call("f", {"x": 2})
    assert parser.finish() == []


def test_a_message_the_prompt_opened():
    prompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>"
    assert opened_header(prompt) == Header("analysis", None, None)
    assert opened_header(prompt[:-len("analysis<|message|>")] + "final<|message|>") == Header("final", None, None)
    assert opened_header("<|start|>user<|message|>") is None            # not the assistant's
    assert opened_header("<|start|>user<|message|>Hi<|end|><|start|>assistant") is None
    parser = make_parser(tool_format="harmony", prompt=prompt)
    deltas = parser.push("Hm.<|end|><|start|>assistant<|channel|>final<|message|>Ok") + parser.finish()
    assert summary(collect(deltas)) == ("Ok", "Hm.", [])
    assert summary(collect(stream(["Ok"], {}))) == ("Ok", None, [])     # not opened: degrades to content


def test_headers():
    assert read_header("<|channel|>final") == Header("final", None, None)
    assert read_header("<|channel|>commentary to=functions.get_weather <|constrain|>json") == \
        Header("commentary", "functions.get_weather", "json")
    assert read_header("assistant to=functions.f<|channel|>commentary json") == \
        Header("commentary", "functions.f", "json")
    assert read_header("functions.f to=assistant<|channel|>commentary") is None   # a tool's turn, not the model's
    assert read_header("<|channel|>final Hello") is None
    assert read_header("assistant<|channel|>commentary to=assistant").recipient is None


def test_a_harmony_vocabulary_ends_at_return_and_call_and_renders_the_rest():
    """o200k_harmony's specials: <|return|> and <|call|> end the generation, <|end|> does
    not, and the channel markers are in the decoded text the parser reads."""
    specials = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
    words = ["Hm", "Yes", "analysis", "final"]
    tokens = words + specials
    tokenizer = Tokenizer.from_metadata({
        "general.architecture": "gpt-oss", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [1] * len(words) + [3] * len(specials),
        "tokenizer.ggml.merges": ["H m"], "tokenizer.ggml.eos_token_id": tokens.index("<|return|>")})
    assert {tokens[i] for i in tokenizer.eog_ids} == set(HARMONY_STOPS)
    reply = ["<|channel|>", "analysis", "<|message|>", "Hm", "<|end|>", "<|start|>", "<|channel|>", "final",
             "<|message|>", "Yes"]
    text = "".join(tokenizer.decode([tokens.index(piece)]) for piece in reply)
    assert summary(parse_output(text, tool_format="harmony")) == ("Yes", "Hm", [])


def test_a_real_generation_streams_through_the_harmony_parser(smollm2_path, golden_date):
    """SmolLM2 rendered with gpt-oss's template, a grammar making it write a harmony reply:
    its markers are plain text here, so they arrive split across tokens; the template's
    stop texts end the reply at <|call|>."""
    from pyengine.api import LLM

    reply = ('"<|channel|>analysis<|message|>" [a-z]{1,8} " weather.<|end|><|start|>assistant<|channel|>'
             'commentary to=functions.get_weather <|constrain|>json<|message|>{\\"city\\": \\"Paris\\"}'
             '<|call|>" [a-z]{1,4}')
    with LLM(str(smollm2_path), n_ctx=1024) as llm:
        session.use_template(llm, SOURCE)
        run = session.start_chat(llm, ASK, tools=[WEATHER], think="high", temperature=0,
                                 grammar=f"root ::= {reply}\n")
        assert "\nReasoning: high\n" in run.prepared.text and run.prepared.tool_format == "harmony"
        pieces = [event for event in run if not isinstance(event, session.ChatResult)]
    result = run.result
    assert result.stop_string == "<|call|>" and result.finish_reason == "tool_calls"
    assert result.reasoning.endswith(" weather.") and result.content == ""
    assert [c["function"] for c in result.tool_calls] == [call("get_weather", {"city": "Paris"})]
    assert sum(len(piece.deltas) for piece in pieces) >= 2   # reasoning streamed before the call


# --------------------------------------------------------------------------------------
# The chat routes with a scripted gpt-oss
# --------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
# A generation that ends at <|call|> (end-of-generation: not in the text), in token-sized pieces.
CALL_REPLY = ["<|channel|>", "analysis", "<|message|>", "Need the", " tool.", "<|end|>", "<|start|>", "assistant",
              "<|channel|>", "commentary", " to", "=functions", ".get_weather", " <|constrain|>", "json",
              "<|message|>", '{"city"', ': "Paris"}']
ANSWER_REPLY = ["<|channel|>", "analysis", "<|message|>", "Report.", "<|end|>", "<|start|>", "assistant",
                "<|channel|>", "final", "<|message|>", "18 °C", " in Paris."]


class _ScriptedGeneration:
    """A generation handle that yields the scripted text pieces, then its Completion."""

    def __init__(self, pieces: list[str], prompt_ids: list[int]) -> None:
        self.pieces, self.prompt_ids = pieces, prompt_ids

    def cancel(self) -> None:
        pass

    def __aiter__(self):
        return self._events()

    async def _events(self):
        for piece in self.pieces:
            yield SimpleNamespace(text=piece, logprobs=None)
        yield Completion(text="".join(self.pieces), tokens=list(range(len(self.pieces))), finish_reason="stop",
                         prompt_tokens=len(self.prompt_ids))


class HarmonyAdapter(FakeAdapter):
    """session.start_chat on a gpt-oss file (rendering, options, reply parsing), the
    generation itself scripted (see `submit`)."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = harmony_llm()
        self.reply = CALL_REPLY
        self.prompts: list[str] = []
        self.submitted: list[tuple[list[int], dict]] = []

    def start_chat(self, messages, *, tools=None, tool_choice=None, format=None, think=None, options=None):
        run = session.start_chat(self.llm, messages, tools=tools, tool_choice=tool_choice, format=format,
                                 think=think, **(options or {}))
        self.prompts.append(run.prepared.text)
        return run

    def submit(self, llm, ids, **options):
        self.submitted.append((list(ids), options))
        return _ScriptedGeneration(self.reply, list(ids))


@pytest.fixture()
def gpt_oss(golden_date, monkeypatch):
    adapter = HarmonyAdapter()
    monkeypatch.setattr(session, "submit", adapter.submit)
    served = {"gpt-oss": DATA / "synth" / "llama-f16.gguf"}
    with running_server(ServerConfig(), loader=fake_loader(adapter), served=served) as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        yield adapter, client


def _sse(response: httpx.Response) -> list[dict]:
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_ollama_chat(gpt_oss):
    adapter, client = gpt_oss
    body = {"model": "gpt-oss", "messages": ASK, "tools": [WEATHER], "think": "high", "stream": False}
    reply = client.post("/api/chat", json=body).json()
    assert "\nReasoning: high\n" in adapter.prompts[-1] and "type get_weather = (_: {" in adapter.prompts[-1]
    message = reply["message"]
    assert message["thinking"] == "Need the tool." and message["content"] == ""
    assert [call["function"] for call in message["tool_calls"]] == \
        [{"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}]
    lines = [json.loads(line) for line in client.post("/api/chat", json={**body, "stream": True}).text.splitlines()]
    assert "".join(line["message"].get("thinking", "") for line in lines) == "Need the tool."
    assert [call["function"]["name"] for line in lines for call in line["message"].get("tool_calls", [])] == \
        ["get_weather"]
    assert lines[-1]["done"] is True and not any("<|" in line["message"]["content"] for line in lines)
    # the answer after the tool's result, with think given as a bool
    adapter.reply = ANSWER_REPLY
    history = ASK + [message, {"role": "tool", "tool_name": "get_weather", "content": "18 C"}]
    reply = client.post("/api/chat", json={**body, "messages": history, "think": False}).json()
    assert "\nReasoning: low\n" in adapter.prompts[-1]
    assert "<|channel|>analysis<|message|>Need the tool.<|end|>" in adapter.prompts[-1]   # no final yet: kept
    assert reply["message"]["content"] == "18 °C in Paris." and reply["message"]["thinking"] == "Report."


def test_openai_chat_completions(gpt_oss):
    adapter, client = gpt_oss
    body = {"model": "gpt-oss", "messages": ASK, "tools": [WEATHER], "reasoning_effort": "low"}
    reply = client.post("/v1/chat/completions", json=body).json()
    assert "\nReasoning: low\n" in adapter.prompts[-1]
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "Need the tool." and choice["message"]["content"] is None
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    chunks = _sse(client.post("/v1/chat/completions", json={**body, "stream": True}))
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert "".join(delta.get("reasoning_content", "") for delta in deltas) == "Need the tool."
    assert [c["function"]["name"] for delta in deltas for c in delta.get("tool_calls", [])] == ["get_weather"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # the OpenAI client sends the turn back with its reasoning: the template shows it before the call
    adapter.reply = ANSWER_REPLY
    history = ASK + [{**choice["message"]}, {"role": "tool", "tool_call_id": tool_call["id"], "content": "18 C"}]
    reply = client.post("/v1/chat/completions", json={**body, "messages": history, "reasoning_effort": "high"}).json()
    assert "\nReasoning: high\n" in adapter.prompts[-1]
    assert "<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant to=functions.get_weather" \
        in adapter.prompts[-1]
    assert reply["choices"][0]["message"]["content"] == "18 °C in Paris."
    assert reply["choices"][0]["message"]["reasoning_content"] == "Report."


def test_generate_after_a_context_reads_harmony(monkeypatch, golden_date):
    """Ollama's /api/generate with an earlier reply's `context`: still read as harmony."""
    started = []
    monkeypatch.setattr(session, "start_prepared", lambda llm, prepared, **options: started.append(prepared))
    adapter = ModelAdapter("gpt-oss", Path("gpt-oss-test.gguf"), harmony_llm())
    adapter.start_generate("Hi", context=[1, 2, 3], think="high", options={})
    (prepared,) = started
    assert prepared.ids[:3] == [1, 2, 3] and prepared.tool_format == "harmony" and prepared.parse
    assert "\nReasoning: high\n" in prepared.text


def test_a_constrained_answer_is_written_in_the_final_channel(gpt_oss):
    adapter, client = gpt_oss
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    adapter.reply = ['{"city"', ': "Paris"}']
    reply = client.post("/api/chat", json={"model": "gpt-oss", "messages": ASK, "format": schema,
                                           "stream": False}).json()
    assert adapter.prompts[-1].endswith("<|start|>assistant<|channel|>final<|message|>")
    ids, options = adapter.submitted[-1]
    assert ids == [len(adapter.prompts[-1]) - len(FINAL_OPENER), len(FINAL_OPENER)]   # the prompt, then the opener
    assert options["format"] == schema and options["stop"] == list(HARMONY_STOPS)
    assert reply["message"]["content"] == '{"city": "Paris"}' and "thinking" not in reply["message"]
    body = {"model": "gpt-oss", "messages": ASK, "response_format": {"type": "json_object"}}
    reply = client.post("/v1/chat/completions", json=body).json()
    assert adapter.prompts[-1].endswith(FINAL_OPENER)
    assert reply["choices"][0]["message"]["content"] == '{"city": "Paris"}'
    adapter.reply = ANSWER_REPLY   # no format: the model opens its channels itself
    client.post("/api/chat", json={"model": "gpt-oss", "messages": ASK, "stream": False})
    assert adapter.prompts[-1].endswith("<|start|>assistant") and "format" not in adapter.submitted[-1][1]


def test_a_forced_call_has_its_header_written_by_the_prompt(gpt_oss):
    adapter, client = gpt_oss
    adapter.reply = ['{"city"', ': "Paris"}']
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = {"model": "gpt-oss", "messages": ASK, "tools": [WEATHER], "tool_choice": named}
    reply = client.post("/v1/chat/completions", json=body).json()
    assert adapter.prompts[-1].endswith(
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>")
    ids, options = adapter.submitted[-1]
    assert ids[-1] == len(harmony_call_header("get_weather")) and options["grammar"] is not None
    assert "format" not in options
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [call("get_weather", {"city": "Paris"})]
    # "required" among several functions: the name is the grammar's to choose, in bare JSON
    other = {"type": "function", "function": {"name": "get_time", "description": "The time.", "parameters": {}}}
    adapter.reply = ['{"name": "get_time", ', '"arguments": {}}']
    reply = client.post("/v1/chat/completions", json={**body, "tools": [WEATHER, other],
                                                      "tool_choice": "required"}).json()
    assert adapter.prompts[-1].endswith("<|start|>assistant")
    assert [c["function"] for c in reply["choices"][0]["message"]["tool_calls"]] == [call("get_time", {})]


def test_responses_reasoning_effort(gpt_oss):
    adapter, client = gpt_oss
    adapter.reply = ANSWER_REPLY
    reply = client.post("/v1/responses", json={"model": "gpt-oss", "input": "Weather in Paris?",
                                               "reasoning": {"effort": "high"}}).json()
    assert "\nReasoning: high\n" in adapter.prompts[-1]
    kinds = [item["type"] for item in reply["output"]]
    assert kinds == ["reasoning", "message"]
    assert reply["output"][0]["content"][0]["text"] == "Report."
    assert reply["output"][1]["content"][0]["text"] == "18 °C in Paris."
