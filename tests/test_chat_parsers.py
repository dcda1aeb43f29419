"""Reasoning and tool-call parsing, one-shot and streamed."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from pyengine.chat import render
from pyengine.chat.parsers import (
    Delta,
    StreamParser,
    collect,
    detect_tool_format,
    parse_output,
    prompt_opens_reasoning,
)
from pyengine.errors import InvalidOptionError

GOLDEN = json.loads((Path(__file__).parent / "data" / "templates_golden.json").read_text())
SOURCES = {name: record["source"] for name, record in GOLDEN["templates"].items()}


def call(name: str, arguments: dict) -> dict:
    """A tool call's function part, as the parsers should produce it."""
    return {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


# (reply text, parser options, expected content, expected reasoning, expected calls)
CASES = {
    "think": (
        "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?",
        {},
        "Hello! How can I help?",
        "The user greets me.",
        [],
    ),
    "think opened by the prompt": (
        "\nThe user greets me.\n</think>\n\nHello!",
        {"starts_in_reasoning": True},
        "Hello!",
        "The user greets me.",
        [],
    ),
    "bracket think": ("[THINK]2+2 is 4[/THINK]It is 4.", {}, "It is 4.", "2+2 is 4", []),
    "reasoning tag": ("<reasoning>short</reasoning> Done.", {}, "Done.", "short", []),
    "gpt-oss channels": (
        "<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant<|channel|>final<|message|>Answer.",
        {},
        "Answer.",
        "Think first.",
        [],
    ),
    "reasoning off keeps tags": ("<think>x</think>y", {"reasoning": False}, "<think>x</think>y", None, []),
    "unclosed think": ("<think>still thinking ", {}, "", "still thinking", []),
    "plain text with angle brackets": ("a < b and <thing> c", {}, "a < b and <thing> c", None, []),
    "hermes": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        {"tool_format": "hermes"},
        "Let me check.",
        None,
        [call("get_weather", {"city": "Paris"})],
    ),
    "hermes two calls after thinking": (
        "<think>Two cities.</think>\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tōkyō «x»"}}\n</tool_call>',
        {"tool_format": "hermes"},
        "",
        "Two cities.",
        [call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Tōkyō «x»"})],
    ),
    "hermes braces in strings": (
        '<tool_call>{"name": "echo", "arguments": {"text": "a } \\" { b"}}</tool_call>',
        {"tool_format": "hermes"},
        "",
        None,
        [call("echo", {"text": 'a } " { b'})],
    ),
    "hermes xml body": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        {"tool_format": "hermes"},
        "",
        None,
        [call("get_weather", {"city": "Paris", "days": 3})],
    ),
    "hermes unclosed at the end": (
        '<tool_call>\n{"name": "f", "arguments": {}}\n',
        {"tool_format": "hermes"},
        "",
        None,
        [call("f", {})],
    ),
    "hermes bad json stays content": (
        "Before <tool_call>{not json}</tool_call> after",
        {"tool_format": "hermes"},
        "Before <tool_call>{not json}</tool_call> after",
        None,
        [],
    ),
    "hermes without name stays content": (
        '<tool_call>{"arguments": {}}</tool_call>',
        {"tool_format": "hermes"},
        '<tool_call>{"arguments": {}}</tool_call>',
        None,
        [],
    ),
    "llama3 json": (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        {"tool_format": "llama3"},
        "",
        None,
        [call("get_weather", {"city": "Paris"})],
    ),
    "llama3 json after space, two calls": (
        '\n {"name": "a", "parameters": {}}; {"type": "function", "name": "b", "parameters": {"x": [1, {"y": 2}]}}',
        {"tool_format": "llama3"},
        "",
        None,
        [call("a", {}), call("b", {"x": [1, {"y": 2}]})],
    ),
    "llama3 python tag json": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        {"tool_format": "llama3"},
        "",
        None,
        [call("get_weather", {"city": "Paris"})],
    ),
    "llama3 builtin tool": (
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        {"tool_format": "llama3"},
        "",
        None,
        [call("brave_search", {"query": "weather in Paris"})],
    ),
    "llama3 code": (
        "<|python_tag|>print(1 + 1)",
        {"tool_format": "llama3"},
        "",
        None,
        [call("python", {"code": "print(1 + 1)"})],
    ),
    "llama3 other json is content": ('{"answer": 42}', {"tool_format": "llama3"}, '{"answer": 42}', None, []),
    "llama3 json inside text is content": (
        'Use {"name": "x", "parameters": {}} like this.',
        {"tool_format": "llama3"},
        'Use {"name": "x", "parameters": {}} like this.',
        None,
        [],
    ),
    "mistral list": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}]',
        {"tool_format": "mistral"},
        "",
        None,
        [call("get_weather", {"city": "Paris"}), call("now", {})],
    ),
    "mistral named with thinking": (
        '[THINK]Need weather.[/THINK]Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        "[TOOL_CALLS]now[ARGS]{}",
        {"tool_format": "mistral"},
        "Checking.",
        "Need weather.",
        [call("get_weather", {"city": "Paris"}), call("now", {})],
    ),
    "mistral named with call id": (
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}',
        {"tool_format": "mistral"},
        "",
        None,
        [call("get_weather", {"city": "Paris"})],
    ),
    "mistral not a call": (
        "[TOOL_CALLS] is what I would write.",
        {"tool_format": "mistral"},
        "[TOOL_CALLS] is what I would write.",
        None,
        [],
    ),
    "mistral truncated": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        {"tool_format": "mistral"},
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        None,
        [],
    ),
    "tool markers ignored without a format": (
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        {},
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        None,
        [],
    ),
}


def summary(parsed) -> tuple:
    """A parse result without the random call ids."""
    return parsed.content, parsed.reasoning, [tool_call["function"] for tool_call in parsed.tool_calls]


def stream(text_pieces: list[str], options: dict) -> list[Delta]:
    parser = StreamParser(**options)
    deltas: list[Delta] = []
    for piece in text_pieces:
        deltas += parser.push(piece)
    return deltas + parser.finish()


def every_split(text: str) -> list[list[str]]:
    """All splits into 2 pieces, and the split into single characters."""
    return [[text[:cut], text[cut:]] for cut in range(len(text) + 1)] + [list(text)]


@pytest.mark.parametrize("name", CASES)
def test_one_shot(name):
    text, options, content, reasoning, calls = CASES[name]
    parsed = parse_output(text, **options)
    assert summary(parsed) == (content, reasoning, calls)
    for tool_call in parsed.tool_calls:
        assert tool_call["type"] == "function"
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}|[A-Za-z0-9]{9}", tool_call["id"])


@pytest.mark.parametrize("name", CASES)
def test_streamed_pieces_add_up_to_one_shot(name):
    text, options, *_ = CASES[name]
    expected = summary(parse_output(text, **options))
    for pieces in every_split(text):
        assert summary(collect(stream(pieces, options))) == expected, pieces


def test_random_replies_stream_like_one_shot():
    fragments = [
        "<think>", "</think>", "<thi", "[THINK]", "[/THINK]", "<tool_call>", "</tool_call>", "</tool",
        '{"name": "f", "arguments": {"a": "}"}}', '{"name":"g","parameters":{}}', "[TOOL_CALLS]",
        'get_x[ARGS]{"q": 1}', "[ARGS]", "[CALL_ID]", "<|python_tag|>", " ", "\n", "hello", "{", "}", '"',
        ";", "<", "<|channel|>analysis<|message|>", "<|end|>", "<function=f>", "<parameter=a>", "1",
        "</parameter>", "</function>", '[{"name":"h","arguments":{}}]',
    ]  # fmt: skip
    rng = random.Random(1234)
    for _ in range(400):
        text = "".join(rng.choice(fragments) for _ in range(rng.randint(1, 8)))
        options = {
            "tool_format": rng.choice([None, "hermes", "llama3", "mistral"]),
            "reasoning": rng.random() < 0.8,
            "starts_in_reasoning": rng.random() < 0.2,
        }
        expected = summary(parse_output(text, **options))
        cuts = sorted(rng.sample(range(len(text) + 1), min(3, len(text) + 1)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert summary(collect(stream(pieces, options))) == expected, (text, options, pieces)
        assert summary(collect(stream(list(text), options))) == expected, (text, options)


def test_text_is_emitted_as_soon_as_it_is_certain():
    parser = StreamParser(tool_format="hermes")
    assert parser.push("Hello wor") == [Delta("content", "Hello wor")]
    assert parser.push("ld <thi") == [Delta("content", "ld")]  # " <thi" might open a block
    assert parser.push("nk>Hm") == [Delta("reasoning", "Hm")]
    assert parser.push("m.</think> Sure. <tool") == [Delta("reasoning", "m."), Delta("content", "Sure.")]
    assert parser.push('_call>{"name": "f", "arguments": {}}') == []
    (delta,) = parser.push("</tool_call>")
    assert delta.kind == "tool_call" and delta.tool_call["function"] == call("f", {})
    assert parser.push(" bye") == [Delta("content", "bye")]
    assert parser.finish() == []


def test_in_reasoning_follows_the_block():
    parser = StreamParser(starts_in_reasoning=True)
    assert parser.in_reasoning
    parser.push("thinking</thi")
    assert parser.in_reasoning
    parser.push("nk>{")
    assert not parser.in_reasoning
    assert not StreamParser().in_reasoning


def test_a_held_back_tail_that_is_no_marker_is_released():
    parser = StreamParser()
    assert parser.push("x <thin") == [Delta("content", "x")]
    assert parser.push("ki") == []  # "<thinki" could still become "<thinking>"
    assert parser.push("e") == [Delta("content", " <thinkie")]
    assert parser.finish() == []


def test_call_ids_are_unique():
    text = "".join(f'<tool_call>{{"name": "f{index}", "arguments": {{}}}}</tool_call>' for index in range(20))
    ids = [tool_call["id"] for tool_call in parse_output(text, tool_format="hermes").tool_calls]
    assert len(set(ids)) == 20


def test_detect_tool_format_from_templates():
    assert detect_tool_format(SOURCES["Qwen-Qwen2.5-7B-Instruct.jinja"]) == "hermes"
    assert detect_tool_format(SOURCES["Qwen3.5-4B.jinja"]) == "hermes"
    assert detect_tool_format(SOURCES["NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"]) == "hermes"
    assert detect_tool_format(SOURCES["meta-llama-Llama-3.1-8B-Instruct.jinja"]) == "llama3"
    assert detect_tool_format(SOURCES["unsloth-mistral-Devstral-Small-2507.jinja"]) == "mistral"
    assert detect_tool_format(SOURCES["mistralai-Ministral-3-14B-Reasoning-2512.jinja"]) == "mistral"
    assert detect_tool_format(SOURCES["google-gemma-2-2b-it.jinja"]) is None
    assert detect_tool_format(None) is None


def test_prompt_opens_reasoning_on_rendered_prompts():
    messages = [{"role": "user", "content": "Hi"}]
    assert prompt_opens_reasoning(render(SOURCES["llama-cpp-deepseek-r1.jinja"], messages))
    assert prompt_opens_reasoning(render(SOURCES["GLM-4.7-Flash.jinja"], messages))
    qwen3 = SOURCES["Qwen-Qwen3-0.6B.jinja"]
    assert not prompt_opens_reasoning(render(qwen3, messages))
    assert not prompt_opens_reasoning(render(qwen3, messages, enable_thinking=False))


def test_bad_parser_use_is_a_typed_error():
    with pytest.raises(InvalidOptionError):
        StreamParser(tool_format="xml")
    parser = StreamParser()
    with pytest.raises(InvalidOptionError):
        parser.push(b"bytes")  # type: ignore[arg-type]
    parser.finish()
    with pytest.raises(InvalidOptionError):
        parser.push("late")
