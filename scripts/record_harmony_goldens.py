"""Record gpt-oss's chat template as transformers renders it: tests/data/harmony/goldens.json.

    pip install transformers          # the reference renderer (no torch needed)
    python scripts/record_harmony_goldens.py

Each case is a conversation twice over: `messages`, in Hugging Face's spelling (what
transformers renders: ``thinking``, arguments as objects), and `client`, as an OpenAI
or Ollama client sends the same turns (``reasoning_content`` or ``thinking``, arguments
as a JSON string or an object, ``developer`` or ``system``, ``tool_name``). `think` is
the request's reasoning setting (Ollama's ``think``, or OpenAI's ``reasoning_effort``
as the server reads it) and `kwargs` the template variables transformers was given for
it. tests/test_harmony.py renders `client` the way pyengine does and compares.
The template's "Current date" comes from strftime_now: both sides run at DATE.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from unittest import mock

import transformers
import transformers.utils.chat_template_utils as hf_chat

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "data" / "harmony" / "openai-gpt-oss-120b.jinja"
# gpt-oss's own chat template, as llama.cpp keeps it (added with its harmony support, b204a5a2)
TEMPLATE_ORIGIN = "ggml-org/llama.cpp models/templates/openai-gpt-oss-120b.jinja @ b204a5a2"
OUT = ROOT / "tests" / "data" / "harmony" / "goldens.json"
DATE = datetime(2026, 11, 29, 12, 0, 0)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    }, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search_notes", "description": "Search the user's notes.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "description": "How many notes at most", "default": 5},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "array", "items": {"type": "number"}},
        "filters": {"type": "object", "properties": {"after": {"type": "string"}, "exact": {"type": "boolean"}},
                    "required": ["after"]},
        "note": {"type": "string", "nullable": True},
    }, "required": ["query"]}}}
LOCATION = {"type": "function", "function": {"name": "get_location", "description": "The user's location."}}
TOOLS = [WEATHER, SEARCH, LOCATION]

QUESTION = {"role": "user", "content": "What's the weather in Paris?"}
RESULT = '{"temperature": 18, "unit": "celsius"}'


def hf_call(arguments: dict) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def openai_call(arguments: dict) -> dict:
    return {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}


CASES = {
    "user_only": dict(
        messages=[{"role": "user", "content": "Hi!"}], client=[{"role": "user", "content": "Hi!"}],
        think=None, kwargs={}),
    "system_user_think_high": dict(
        messages=[{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi!"}],
        client=[{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi!"}],
        think="high", kwargs={"reasoning_effort": "high"}),
    "developer_tools_low": dict(
        messages=[{"role": "developer", "content": "Be brief."}, QUESTION],
        client=[{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}, QUESTION],
        tools=TOOLS, think="low", kwargs={"reasoning_effort": "low"}),
    "openai_tool_round_trip": dict(
        messages=[QUESTION,
                  {"role": "assistant", "content": "", "thinking": "Need the weather tool.",
                   "tool_calls": [hf_call({"city": "Paris"})]},
                  {"role": "tool", "content": RESULT}],
        client=[QUESTION,
                {"role": "assistant", "content": None, "reasoning_content": "Need the weather tool.",
                 "tool_calls": [openai_call({"city": "Paris"})]},
                {"role": "tool", "tool_call_id": "call_1", "content": RESULT}],
        tools=[WEATHER], think=None, kwargs={}),
    "ollama_multi_turn_drops_reasoning": dict(
        messages=[{"role": "user", "content": "Hello"},
                  {"role": "assistant", "content": "Hi! How can I help?", "thinking": "A greeting."},
                  QUESTION,
                  {"role": "assistant", "content": "", "thinking": "Call the tool.",
                   "tool_calls": [hf_call({"city": "Paris", "unit": "celsius"})]},
                  {"role": "tool", "content": RESULT},
                  {"role": "assistant", "content": "It is 18 °C in Paris.", "thinking": "Report it."},
                  {"role": "user", "content": "Thanks!"}],
        client=[{"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi! How can I help?", "thinking": "A greeting."},
                QUESTION,
                {"role": "assistant", "content": "", "thinking": "Call the tool.",
                 "tool_calls": [{"function": {"name": "get_weather",
                                              "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                {"role": "tool", "tool_name": "get_weather", "content": RESULT},
                {"role": "assistant", "content": "It is 18 °C in Paris.", "thinking": "Report it."},
                {"role": "user", "content": "Thanks!"}],
        tools=[WEATHER], think=True, kwargs={"reasoning_effort": "medium"}),
    "final_turn_for_training": dict(
        messages=[QUESTION, {"role": "assistant", "content": "Sunny.", "thinking": "Guess."}],
        client=[QUESTION, {"role": "assistant", "content": "Sunny.", "reasoning_content": "Guess."}],
        think=None, kwargs={}, add_generation_prompt=False),
    "builtin_tools_identity_think_false": dict(
        messages=[{"role": "system", "content": "Cite sources."}, {"role": "user", "content": "Who won?"}],
        client=[{"role": "system", "content": "Cite sources."}, {"role": "user", "content": "Who won?"}],
        tools=[SEARCH], think=False,
        extra={"builtin_tools": ["browser", "python"], "model_identity": "You are a test model."},
        kwargs={"reasoning_effort": "low"}),
    "unicode": dict(
        messages=[{"role": "developer", "content": "Réponds «brièvement» 🙂"},
                  {"role": "user", "content": "東京の天気は？\n\"quoted\" \\ backslash"}],
        client=[{"role": "developer", "content": "Réponds «brièvement» 🙂"},
                {"role": "user", "content": "東京の天気は？\n\"quoted\" \\ backslash"}],
        tools=[WEATHER], think="medium", kwargs={"reasoning_effort": "medium"}),
}


class _FixedDatetime(datetime):
    @classmethod
    def now(cls, tz=None):
        return DATE


def main() -> None:
    source = TEMPLATE.read_text()
    cases = {}
    with mock.patch.object(hf_chat, "datetime", _FixedDatetime):
        for name, case in CASES.items():
            generation = case.get("add_generation_prompt", True)
            extra = case.get("extra", {})
            text = hf_chat.render_jinja_template(
                conversations=[case["messages"]], tools=case.get("tools"), chat_template=source,
                add_generation_prompt=generation, **extra, **case["kwargs"])[0][0]
            cases[name] = {"messages": case["messages"], "client": case["client"], "tools": case.get("tools"),
                           "think": case["think"], "extra": extra, "kwargs": case["kwargs"],
                           "add_generation_prompt": generation, "text": text}
    record = {"template": TEMPLATE.name, "origin": TEMPLATE_ORIGIN, "date": DATE.strftime("%Y-%m-%d"),
              "renderer": f"transformers {transformers.__version__} render_jinja_template", "cases": cases}
    OUT.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} conversations)")


if __name__ == "__main__":
    main()
