"""Chat template rendering: parity with transformers, the sandbox, the budget."""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from pyengine.chat import ChatTemplate, render, supports_thinking, thinking_kwargs
from pyengine.errors import InvalidOptionError, TemplateError, TemplateSecurityError

GOLDEN = json.loads((Path(__file__).parent / "data" / "templates_golden.json").read_text())
USER = [{"role": "user", "content": "hi"}]
# The brief allows 2 s; a failing render must come back within it, compile included.
TIME_BOUND_S = 2.0


def _golden_cases() -> list[tuple[str, str]]:
    return [(name, scenario) for name, record in GOLDEN["templates"].items() for scenario in record["renders"]]


def _render_golden(name: str, scenario: str) -> str:
    special = GOLDEN["special"]
    case = GOLDEN["scenarios"][scenario]
    return render(
        GOLDEN["templates"][name]["source"],
        case["messages"],
        tools=case.get("tools"),
        add_generation_prompt=case["add_generation_prompt"],
        bos_token=special["bos_token"],
        eos_token=special["eos_token"],
        date_string=special["date_string"],
    )


def test_golden_covers_48_templates_and_7_conversations():
    assert len(GOLDEN["templates"]) == 48
    assert len(_golden_cases()) == 336


@pytest.mark.parametrize(("name", "scenario"), _golden_cases())
def test_renders_as_transformers(name, scenario):
    expected = GOLDEN["templates"][name]["renders"][scenario]
    if "error" in expected:
        with pytest.raises(TemplateError):
            _render_golden(name, scenario)
    else:
        assert _render_golden(name, scenario) == expected["text"]


# -- HF environment behaviour -----------------------------------------------------


def test_tojson_behaves_like_transformers():
    value = {"b": "<é>", "a": [1, 2]}
    assert render("{{ x | tojson }}", USER, x=value) == '{"b": "<é>", "a": [1, 2]}'
    assert render("{{ x | tojson(ensure_ascii=True) }}", USER, x=value) == '{"b": "<\\u00e9>", "a": [1, 2]}'
    assert render("{{ x | tojson(sort_keys=True) }}", USER, x=value) == '{"a": [1, 2], "b": "<é>"}'
    assert render("{{ x | tojson(separators=(',', ':')) }}", USER, x=value) == '{"b":"<é>","a":[1,2]}'
    assert render("{{ x | tojson(indent=2) }}", USER, x={"a": 1}) == '{\n  "a": 1\n}'


def test_trim_and_lstrip_blocks_are_on():
    template = "<a>\n  {% if true %}\nX\n  {% endif %}\n</a>"
    assert render(template, USER) == "<a>\nX\n</a>"


def test_loop_controls_and_generation_block():
    template = (
        "{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}"
        "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"
        "{% generation %}[{{ messages[0].content }}]{% endgeneration %}"
    )
    assert render(template, USER) == "023[hi]"


def test_variables_given_to_templates():
    template = (
        "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|"
        "{{ documents is none }}|{{ enable_thinking }}"
    )
    out = render(template, USER, bos_token="<s>", eos_token="</s>", enable_thinking=False)
    assert out == "<s>|</s>|True|True|True|False"
    docs = [{"title": "t", "text": "body"}]
    assert render("{{ documents[0].text }}", USER, documents=docs) == "body"


def test_strftime_now_formats_the_current_time():
    assert render("{{ strftime_now('%Y') }}", USER) == str(datetime.now().year)


def test_undefined_values_follow_jinja_defaults():
    assert render("[{{ missing }}]", USER) == "[]"
    with pytest.raises(TemplateError, match="missing"):
        render("{{ missing.attr }}", USER)


def test_raise_exception_carries_the_template_message():
    with pytest.raises(TemplateError, match="^Conversation roles must alternate$"):
        render("{{ raise_exception('Conversation roles must alternate') }}", USER)


def test_syntax_error_is_a_template_error_with_line():
    with pytest.raises(TemplateError, match="line 2"):
        ChatTemplate("ok\n{% if %}")


def test_template_jinja_compiles_to_bad_python_is_a_template_error():
    """jinja2 parses a slice followed by a comma but writes Python that does not compile
    (a SyntaxError escaped; found by fuzzing templates)."""
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{{ x[:,2] }}")


def test_compiled_template_renders_many_times():
    template = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}", "<s>")
    assert template.render(USER) == "<s>user:hi;"
    assert template.render([{"role": "user", "content": "again"}]) == "<s>user:again;"


@pytest.mark.parametrize("messages", ["hello", [["user", "hi"]], None, 3])
def test_bad_messages_are_rejected(messages):
    with pytest.raises(InvalidOptionError):
        render("{{ messages }}", messages)


def test_bad_tools_are_rejected():
    with pytest.raises(InvalidOptionError):
        render("{{ tools }}", USER, tools="get_weather")


# -- fallback and thinking switches -----------------------------------------------


def test_fallback_is_chatml():
    fallback = ChatTemplate.fallback()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "image"}, {"type": "text", "text": "there"}]},
    ]
    assert fallback.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert fallback.render(USER, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_fallback_renders_tools_and_tool_calls():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "18C"},
    ]
    out = ChatTemplate.fallback().render(messages, tools=tools)
    assert out.startswith("<|im_start|>system\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "get_weather", "parameters": {}}}\n</tools>' in out
    # Qwen's form: a call per <tool_call> block, results as <tool_response> in a user turn
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n' in out
    assert out.endswith("<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
                        "<|im_start|>assistant\n")


def test_thinking_switches_are_detected():
    sources = {name: record["source"] for name, record in GOLDEN["templates"].items()}
    assert supports_thinking(sources["Qwen-Qwen3-0.6B.jinja"])
    assert not supports_thinking(sources["Qwen-Qwen2.5-7B-Instruct.jinja"])
    assert thinking_kwargs(sources["Qwen-Qwen3-0.6B.jinja"], False) == {"enable_thinking": False}
    assert thinking_kwargs(sources["MiniMax-M3.jinja"], True) == {"thinking_mode": "enabled"}
    assert thinking_kwargs(sources["Qwen-Qwen2.5-7B-Instruct.jinja"], True) == {}


def test_enable_thinking_false_changes_qwen3_prompt():
    source = GOLDEN["templates"]["Qwen-Qwen3-0.6B.jinja"]["source"]
    off = render(source, USER, **thinking_kwargs(source, False))
    on = render(source, USER, **thinking_kwargs(source, True))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n")


# -- the sandbox ------------------------------------------------------------------

INJECTIONS = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% if ''.__class__ %}x{% endif %}",
    "{{ ().__class__.__bases__[0].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__['os'] }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ self.__init__.__globals__.__builtins__ }}",
    "{{ self._TemplateReference__context.cycler }}",
    "{{ request.application.__globals__.__builtins__.__import__('os') }}",
    "{{ config.__class__.__init__.__globals__['os'] }}",
    "{{ os.popen('id').read() }}",
    "{{ __import__('os').system('id') }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{{ '{0.__init__.__globals__}'.format(cycler) }}",
    "{% set f = '{0.' ~ '__class__}' %}{{ f.format(messages) }}",
    "{{ ''|attr('__class__') }}",
    "{% set a = '__cla' ~ 'ss__' %}{{ ''|attr(a) }}",
    "{% set a = '__cla' ~ 'ss__' %}{{ messages[a] }}",
    "{{ messages|map(attribute='__class__')|list }}",
    "{{ messages|map(attribute='0.__class__')|list }}",
    "{{ ''['\\x5f\\x5fclass\\x5f\\x5f'] }}",
    "{{ cycler|attr('\\x5f\\x5finit\\x5f\\x5f') }}",
    "{{ cycler|attr(['_' * 2, 'init', '_' * 2]|join) }}",
    "{{ dict.mro() }}",
    "{{ messages.append(1) }}",
    "{{ messages[0].update({'role': 'system'}) }}",
]


@pytest.mark.parametrize("payload", INJECTIONS)
def test_injection_payloads_raise_security_errors(payload):
    start = time.monotonic()
    with pytest.raises(TemplateSecurityError):
        render(payload, USER)
    assert time.monotonic() - start < TIME_BOUND_S


DENIALS = {
    "self-recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "branching recursive macro": "{% macro f() %}{{ f() }}{{ f() }}{% endmacro %}{{ f() }}",
    "recursion through caller": (
        "{% macro m() %}{{ caller() }}{% endmacro %}{% macro r() %}{% call m() %}{{ r() }}{% endcall %}{% endmacro %}{{ r() }}"
    ),
    "recursive loop": "{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}",
    "huge range": "{% for i in range(10**9) %}x{% endfor %}",
    "silent nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested loops into a set block": (
        "{% set s %}{% for i in range(100000) %}{% for j in range(100000) %}xy{% endfor %}{% endfor %}{% endset %}"
    ),
    "huge output": "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
    "huge repeat": "{{ 'x' * 10**12 }}",
    "huge list repeat": "{{ (messages * 10**9) | length }}",
    "huge power": "{{ 10 ** (10 ** 10) }}",
    "doubling with ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "growing replace": (
        "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s.replace('x', 'xxxx') %}{% endfor %}"
    ),
    "growing join": "{{ range(100000) | join('x' * 100000) }}",
    "huge width": "{{ '{:>10000000000}'.format('a') }}",
    "huge center": "{{ 'a' | center(10000000000) }}",
    "huge percent width": "{{ '%*s' % (10000000000, 'a') }}",
}


@pytest.mark.parametrize("template", DENIALS.values(), ids=DENIALS.keys())
def test_runaway_templates_stop_in_time(template):
    start = time.monotonic()
    with pytest.raises(TemplateError) as caught:
        render(template, USER)
    assert time.monotonic() - start < TIME_BOUND_S
    assert not isinstance(caught.value, TemplateSecurityError)


def test_output_limit_is_configurable():
    template = ChatTemplate("{% for i in range(1000) %}0123456789{% endfor %}", max_output_chars=5000)
    with pytest.raises(TemplateError, match="exceeds 5000"):
        template.render(USER)
    assert len(ChatTemplate(template.source, max_output_chars=10_000).render(USER)) == 10_000


def test_budgets_of_concurrent_renders_are_independent():
    slow = ChatTemplate(DENIALS["silent nested loops"])
    fast = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    results: list[str] = []

    def render_fast_repeatedly() -> None:
        for _ in range(200):
            results.append(fast.render(USER))

    worker = threading.Thread(target=render_fast_repeatedly)
    worker.start()
    with pytest.raises(TemplateError, match="longer than"):
        slow.render(USER)
    worker.join()
    assert results == ["hi"] * 200


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # jinja2's lexer on mangled escapes
def test_mutated_templates_render_or_fail_with_template_errors():
    """The golden templates with a few tokens of Jinja inserted, deleted or replaced
    (seeded): each compiles and renders, or fails with a TemplateError, within its time
    budget."""
    pieces = ["{%", "%}", "{{", "}}", "-", "|", "(", ")", "[", "]", ".", ",", "'", ":", " ", "for", "if", "endif",
              "endfor", "set", "loop.", "range(", "9999", "*", "~", "messages", "tojson", "items()", "else"]
    sources = [record["source"] for record in GOLDEN["templates"].values()]
    scenarios = list(GOLDEN["scenarios"].values())
    rendered = 0
    for seed in range(120):
        rng = random.Random(seed)
        text = list(rng.choice(sources))
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(text))
            kind = rng.random()
            if kind < 0.5:
                text.insert(at, rng.choice(pieces))
            elif kind < 0.8:
                del text[at]
            else:
                text[at] = rng.choice(pieces)
        scenario = rng.choice(scenarios)
        try:
            template = ChatTemplate("".join(text), "<s>", "</s>", time_limit_s=2.0)
            template.render(scenario["messages"], tools=scenario.get("tools"),
                            add_generation_prompt=scenario.get("add_generation_prompt", True))
            rendered += 1
        except TemplateError:
            pass
    assert rendered > 5
