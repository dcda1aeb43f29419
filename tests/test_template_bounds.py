"""Every global, filter and operator a chat template reaches is bounded in time and memory:
a hostile template fails within the render's deadline, without growing the process by
more than the render's memory cap, with a TemplateError that names whose template it is."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest

from pyengine.chat import ChatTemplate
from pyengine.chat.prompt import model_template
from pyengine.chat.sandbox import GuardedEnvironment
from pyengine.errors import TemplateError, TemplateSecurityError

USER = [{"role": "user", "content": "hi"}]
NAME = "Evil-Model-7B"
TIME_BOUND_S = 3.0                 # the deadline is 1.5 s; compile and unwinding fit in the rest
MEMORY_BOUND = 150 * 2**20         # the render's cap is 64 MiB of growth, checked every few MiB
BIG = "{% set big = 'ab cd\\n' * 160000 %}"   # about 1 MB: what the size cap still lets through

BOMBS = {
    "lipsum": "{{ lipsum(10**9) }}",
    "lipsum in a loop": "{% for i in range(100000) %}{% set x = lipsum(100) %}{% endfor %}",
    "range": "{% for i in range(10**9) %}{% endfor %}",
    "range with a step": "{{ range(0, 10**12, 1) | length }}",
    "range listed": "{{ range(10**9) | list | length }}",
    "range of ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
    "wordwrap": BIG + "{{ big | wordwrap(1) }}",
    "wordwrap in a loop": BIG + "{% for i in range(1000) %}{% set x = big | wordwrap(3) %}{% endfor %}",
    "center": "{{ 'a' | center(10**9) }}",
    "indent": BIG + "{{ big | indent(1000) }}",
    "format": "{{ '%s' | format('x' * 10**9) }}",
    "format width": "{{ '%0999999999d' | format(1) }}",
    "percent": "{{ '%0999999999d' % 1 }}",
    "star": "{{ 'x' * 10**10 }}",
    "join": "{{ range(100000) | join('x' * 100000) }}",
    "batch": BIG + "{{ big | batch(1) | list | length }}",
    "slice": BIG + "{{ big | slice(100000) | list | length }}",
    "urlize": BIG + "{{ big | urlize }}",
    "title": BIG + "{% for i in range(100) %}{% set x = big | title %}{% endfor %}",
    "sort": BIG + "{% for i in range(100) %}{% set x = big | sort %}{% endfor %}",
    "unique": BIG + "{% for i in range(100) %}{% set x = big | unique | list %}{% endfor %}",
    "map chain": BIG + "{{ big | map('upper') | map('lower') | map('upper') | map('lower') | join | length }}",
    "pprint": BIG + "{{ (big | list) | pprint | length }}",
    "sum of lists": "{{ ([[1]] * 50000) | sum(start=[]) | length }}",
    "list of big strings": (
        BIG + "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [big ~ i] %}{% endfor %}"
    ),
    "list repeating a big string": BIG + "{% set l = [big] * 100000 %}{{ l }}",
    "nested literals": BIG + "{% set a = [big, big] %}{% set b = [a, a] %}{% set c = [b, b] %}{{ c }}",
    "dict of big values": (
        "{% set ns = namespace(d={}) %}{% for i in range(100000) %}"
        "{% set ns.d = dict(ns.d, **{('k' ~ i): 'x' * 100000}) %}{% endfor %}"
    ),
    "set block": BIG + "{% set x %}{% for i in range(100000) %}{{ big }}{% endfor %}{% endset %}",
    "macro output": BIG + "{% macro m() %}{% for i in range(100000) %}{{ big }}{% endfor %}{% endmacro %}{{ m() | length }}",
    "filter block": BIG + "{% filter upper %}{% for i in range(100000) %}{{ big }}{% endfor %}{% endfilter %}",
    "literal text in a loop": "{% set x %}{% for i in range(100000) %}" + "y" * 100000 + "{% endfor %}{% endset %}",
    "integer squaring": "{% set ns = namespace(n=3) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "recursion through a macro": "{% macro f(n) %}{{ f(n) ~ f(n) }}{% endmacro %}{{ f(1) }}",
    "mutual recursion": "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{{ a() }}{% endmacro %}{{ a() }}",
    "namespaces repeated": BIG + "{% set ns = namespace(s=big) %}{% set l = [ns] * 100000 %}{{ l }}",
    "dict views repeated": BIG + "{% set d = {'a': big} %}{% set l = [d.values()] * 1000 %}{{ l | string | length }}",
    "format fields": BIG + "{{ ('{0}' * 250000).format(big) | length }}",
    "named format fields": BIG + "{{ ('{a}' * 250000).format_map({'a': big}) | length }}",
    "percent fields": BIG + "{{ ('%(a)s' * 200000) % {'a': big} }}",
    "format filter fields": BIG + "{{ ('%s' * 200000) | format(big) }}",
    "split in a loop": BIG + "{% for i in range(1000) %}{% set x = big.split() %}{% endfor %}",
    "replace in a loop": BIG + "{% for i in range(100000) %}{% set x = big | replace('a', 'b') %}{% endfor %}",
}


def _anonymous_rss() -> int:
    with open("/proc/self/statm") as statm:
        fields = statm.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


def _render_watched(template: ChatTemplate) -> tuple[BaseException | None, float, int]:
    """Render; the error, the seconds taken and the peak growth of anonymous memory."""
    start_rss = _anonymous_rss()
    peak = [start_rss]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _anonymous_rss())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    error = None
    try:
        template.render(USER)
    except BaseException as exc:   # noqa: BLE001 - the test asserts its type
        error = exc
    elapsed = time.monotonic() - started
    done.set()
    watcher.join()
    return error, elapsed, max(peak[0], _anonymous_rss()) - start_rss


@pytest.mark.parametrize("source", BOMBS.values(), ids=BOMBS.keys())
def test_bombs_fail_fast_in_bounded_memory_naming_the_template(source):
    started = time.monotonic()
    try:
        template = ChatTemplate(source, name=NAME)
    except TemplateError as error:   # refused while compiling: fine, if named
        assert f"the chat template of {NAME}" in str(error)
        return
    error, elapsed, grown = _render_watched(template)
    assert isinstance(error, TemplateError), repr(error)
    assert f"the chat template of {NAME}" in str(error)
    assert time.monotonic() - started < TIME_BOUND_S and elapsed < TIME_BOUND_S
    assert grown < MEMORY_BOUND, f"grew {grown / 2**20:.0f} MiB"


def test_lipsum_is_gone_and_range_is_capped():
    environment = GuardedEnvironment()
    assert "lipsum" not in environment.globals
    assert ChatTemplate("{{ range(3) | list }}").render(USER) == "[0, 1, 2]"
    assert ChatTemplate("{{ range(100000) | length }}").render(USER) == "100000"
    with pytest.raises(TemplateError, match="at most 100000"):
        ChatTemplate("{{ range(100001) | length }}").render(USER)


def test_reasonable_uses_of_the_bounded_filters_still_work():
    source = (
        "{{ 'hello world' | title }}|{{ 'a b c' | wordwrap(3) | length }}|{{ [3, 1, 2] | sort | join(',') }}|"
        "{{ 'abc' | batch(2) | list | length }}|{{ [1, 2, 3] | sum }}|{{ messages | map(attribute='role') | join }}|"
        "{% set ns = namespace(l=[]) %}{% for i in range(2000) %}{% set ns.l = ns.l + [i] %}{% endfor %}"
        "{{ ns.l | length }}|{{ ('x' * 1000) | length }}|{{ {'a': [1, {'b': 'c'}]} | tojson }}"
    )
    assert ChatTemplate(source).render(USER) == 'Hello World|5|1,2,3|2|6|user|2000|1000|{"a": [1, {"b": "c"}]}'


def test_errors_name_the_template_but_keep_the_templates_own_words():
    named = ChatTemplate("{% for i in range(10**9) %}{% endfor %}", name=NAME)
    with pytest.raises(TemplateError, match=f"^the chat template of {NAME} asked for a range"):
        named.render(USER)
    refusal = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}", name=NAME)
    with pytest.raises(TemplateError, match="^Conversation roles must alternate$"):
        refusal.render(USER)
    with pytest.raises(TemplateSecurityError, match=f"^the chat template of {NAME}"):
        ChatTemplate("{{ ''.__class__ }}", name=NAME)
    with pytest.raises(TemplateError, match=f"^the chat template of {NAME} syntax error"):
        ChatTemplate("{% if %}", name=NAME)


def test_a_models_template_is_named_after_the_model():
    metadata = {"tokenizer.chat_template": "{% for i in range(10**9) %}{% endfor %}", "general.name": NAME}
    gguf = SimpleNamespace(get_str=lambda key, default="": metadata.get(key, default), path="/models/x.gguf",
                           architecture="llama")
    tokenizer = SimpleNamespace(bos_id=None, eos_id=None)
    with pytest.raises(TemplateError, match=f"the chat template of {NAME}"):
        model_template(gguf, tokenizer).render(USER)
    del metadata["general.name"]
    with pytest.raises(TemplateError, match="the chat template of x.gguf"):
        model_template(gguf, tokenizer).render(USER)
