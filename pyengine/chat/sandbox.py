"""The Jinja environment chat templates run in.

It is Jinja2's ``ImmutableSandboxedEnvironment`` configured the way Hugging Face
transformers configures it for ``apply_chat_template`` (``trim_blocks``,
``lstrip_blocks``, the loop-controls extension, a ``{% generation %}`` block, the
``raise_exception`` and ``strftime_now`` globals and HF's ``tojson`` filter), so that
templates render byte for byte as they do there, with these additions:

* Escapes are errors, not silent blanks. Reaching an unsafe attribute (anything
  private or dunder, function globals, frames, mutating methods of lists and dicts),
  or naming ``os``, ``sys``, ``subprocess``... raises TemplateSecurityError at once;
  Jinja alone would hand back an Undefined that prints as "".
* Every loop, call, lookup and output piece checks the render's deadline, calls that
  run template code count towards a nesting cap, and operators, string methods and
  filters that could build a huge value are refused beforehand (see
  :mod:`pyengine.chat.budget` and :mod:`pyengine.chat.growth`). What a filter or a call
  returns lazily (``map``, ``batch``, ...) checks the deadline at each item, so work done
  inside another filter's loop (``join``, ``list``) stops in time too; filters that loop
  in Python over words or items get inputs of bounded size; every value built, output
  pieces of set blocks and macros included, counts towards the render's memory.
* Jinja's ``lipsum`` global (paragraphs of lorem ipsum, unbounded) is gone; ``range``
  is capped at :data:`MAX_RANGE` items, as Jinja's sandbox caps it, with a TemplateError.

Loops are guarded by rewriting the parsed template: the iterable of each ``for`` is
wrapped in :meth:`GuardedEnvironment.guard_iter`, each ``~`` concatenation becomes
a call of :meth:`GuardedEnvironment.guard_concat`, and each piece of output (in any
buffer: set blocks, macros, filter blocks) passes :meth:`GuardedEnvironment.guard_output`. Both are reached through
``environment.<name>`` in the compiled code, which no template can rebind.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator as AnyIterator
from collections.abc import Sized
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator

from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.exceptions import UndefinedError
from jinja2.runtime import LoopContext, Macro, Undefined
from jinja2.utils import missing
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pyengine.chat import budget, growth
from pyengine.errors import TemplateError, TemplateSecurityError

# Names a template has no business looking up; asking for one is an escape attempt.
_FORBIDDEN_NAMES = frozenset(
    {
        "os", "sys", "subprocess", "builtins", "__builtins__", "importlib", "__import__",
        "eval", "exec", "compile", "open", "globals", "locals", "vars", "getattr", "setattr",
    }
)  # fmt: skip


_OWN_GUARDS = ("guard_iter", "guard_concat", "guard_output", "guard_literal")
# As Jinja's sandbox caps range().
MAX_RANGE = 100_000


class _GuardedUndefined(Undefined):
    """Jinja's default Undefined, except for names that only an exploit asks for."""

    __slots__ = ()

    def __init__(self, hint: Any = None, obj: Any = missing, name: Any = None, exc: Any = UndefinedError):
        # obj is missing only for a top-level name: `os`, not `message.os`
        if hint is None and obj is missing and isinstance(name, str) and name in _FORBIDDEN_NAMES:
            raise TemplateSecurityError(f"chat template looked up the forbidden name {name!r}")
        super().__init__(hint, obj, name, exc)


def guarded_range(*args: Any) -> range:
    """range() of at most MAX_RANGE items."""
    try:
        items = range(*args)
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"chat template called range{args}: {exc}") from None
    if len(items) > MAX_RANGE:
        raise TemplateError(f"chat template asked for a range of {len(items)} items (at most {MAX_RANGE})")
    return items


def _ticking(items: Iterable[Any]) -> Iterator[Any]:
    """The items of a lazy result, checking the deadline (and memory) at each one."""
    for item in items:
        budget.tick()
        budget.charge(item)
        yield item


def _lazy(value: Any) -> bool:
    return isinstance(value, AnyIterator) and not isinstance(value, Sized)


class TemplateRefusal(TemplateError):
    """A template's own refusal of a conversation (raise_exception): its message is the template's."""


def raise_exception(message: Any) -> None:
    """The global templates call to refuse a conversation (as in transformers)."""
    raise TemplateRefusal(str(message))


def strftime_now(format: str) -> str:  # noqa: A002 - the name templates use
    """The current local time formatted with strftime (as in transformers)."""
    budget.check_format_string(format, "strftime_now")
    return datetime.now().strftime(format)


def hf_tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' tojson: plain json.dumps, no HTML escaping, unicode kept."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class GenerationExtension(Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's
    tokens with it (for training masks); when rendering a prompt it just renders its body,
    in a call-block scope like transformers' own."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @staticmethod
    def _render_body(caller: Callable[[], str]) -> str:
        return caller()


class _NotAtCompileTime(Exception):
    """Raised by guarded filters outside a render so that Jinja's optimizer does not
    evaluate them while compiling (it catches any exception and leaves the call for
    render time, where the budget applies)."""


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a filter with the deadline, the pre-checks of `growth` and a size check."""

    @functools.wraps(func)  # keeps jinja_pass_arg, so context/environment still get passed
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if budget.current() is None:
            raise _NotAtCompileTime(name)
        budget.tick()
        pass_arg = getattr(func, "jinja_pass_arg", None)
        value_args = args[1:] if pass_arg is not None else args
        if name == "join" and value_args:
            # estimate the joined size before joining, even over a generator
            value_args = (growth.sized(value_args[0]), *value_args[1:])
            args = (*args[: len(args) - len(value_args)], *value_args)
        growth.check_filter(name, value_args, kwargs)
        result = func(*args, **kwargs)
        if _lazy(result):
            return _ticking(result)
        return budget.check_value(result, f"filter {name!r}")

    return guarded


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    """HF's chat-template environment with escape detection and a time/size budget."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[loopcontrols, GenerationExtension],
            undefined=_GuardedUndefined,
        )
        self.filters["tojson"] = hf_tojson
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.globals["raise_exception"] = raise_exception
        self.globals["strftime_now"] = strftime_now
        self.globals["range"] = guarded_range
        del self.globals["lipsum"]   # chat templates never need it; lipsum(10**9) ran for minutes

    # -- parsing: wrap loops and concatenations --------------------------------

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        _refuse_static_escapes(tree)
        for loop in tree.find_all(nodes.For):
            loop.iter = self._env_call("guard_iter", [loop.iter], loop.iter.lineno)
        for parent in list(tree.find_all(nodes.Node)):
            _replace_concats(parent, self._env_call)
        for parent in list(tree.find_all(nodes.Node)):
            _replace_literals(parent, self._env_call)
        for output in tree.find_all(nodes.Output):
            output.nodes = [self._env_call("guard_output", [node], node.lineno) for node in output.nodes]
        return tree

    @staticmethod
    def _env_call(method: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
        target = nodes.EnvironmentAttribute(method, lineno=lineno)
        return nodes.Call(target, args, [], None, None, lineno=lineno)

    def guard_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Iterate like the loop would, checking the deadline before each item."""
        budget.tick()
        for item in iterable:
            budget.tick()
            yield item

    def guard_literal(self, value: Any) -> Any:
        """A list, tuple or dict written in the template: nested ones can hold a big
        string many times over (printing it would write every copy)."""
        return budget.check_value(value, "a literal")

    def guard_output(self, value: Any) -> str:
        """One piece of output, in any buffer: the deadline, and its size towards memory."""
        budget.tick()
        if not isinstance(value, str):
            budget.check_value(value, "output")   # a container's text can be far bigger than itself
        text = str(value)
        budget.count_written(text)
        budget.charge(text)
        return text

    def guard_concat(self, *parts: Any) -> str:
        """The ``~`` operator (str_join) with a size check before joining."""
        for part in parts:
            if not isinstance(part, str):
                budget.check_value(part, "'~'")
        texts = [str(part) for part in parts]
        budget.refuse_size(sum(len(text) for text in texts), "'~'")
        joined = "".join(texts)
        budget.charge(joined)
        return joined

    # -- runtime hooks of the sandbox ------------------------------------------

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget.tick()
        if getattr(__obj, "__self__", None) is __self and __obj.__name__ in _OWN_GUARDS:
            return __obj(*args)  # kwargs only hold Jinja's _loop_vars/_block_vars
        if isinstance(__obj, LoopContext) and args:
            # loop(children) in a recursive for: guard the new level's items too
            args = (__self.guard_iter(args[0]), *args[1:])
        target = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by the sandbox
        args = growth.check_str_method(target, args, kwargs)
        if _runs_template_code(__obj):
            with budget.nested_call():
                result = super().call(__context, __obj, *args, **kwargs)
        else:
            result = super().call(__context, __obj, *args, **kwargs)
        if _lazy(result):
            return _ticking(result)
        return budget.check_value(result, "call result")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget.tick()
        growth.check_binop(operator, left, right)
        if operator == "+" and isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            budget.check_joined(left, right, "'+'")
            result = super().call_binop(context, operator, left, right)
            budget.remember_sum(result, left, right)
            budget.charge(result)
            return result
        return budget.check_value(super().call_binop(context, operator, left, right), repr(operator))

    def getattr(self, obj: Any, attribute: str) -> Any:
        budget.tick()
        _refuse_dunder(obj, attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget.tick()
        if isinstance(argument, str):
            _refuse_dunder(obj, argument)
        return super().getitem(obj, argument)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        raise TemplateSecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is not allowed in a chat template"
        )


# Filters that look attributes up by a name given as a string ("a.b.c" paths).
_ATTRIBUTE_FILTERS = frozenset(
    {"attr", "map", "selectattr", "rejectattr", "sort", "groupby", "sum", "unique", "min", "max"}
)
_MANGLED_PRIVATE = re.compile(r"_[A-Za-z0-9]+__")


def _is_escape_name(name: Any) -> bool:
    """Dunder names and name-mangled privates (``_TemplateReference__context``)."""
    return isinstance(name, str) and (name.startswith("__") or _MANGLED_PRIVATE.match(name) is not None)


def _refuse_static_escapes(tree: nodes.Template) -> None:
    """Refuse, at compile time, lookups no chat template needs: ``x.__class__``,
    ``x['__globals__']``, ``x|attr('__class__')``, ``map(attribute='a.__class__')``."""
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter)):
        if isinstance(node, nodes.Getattr):
            names = [node.attr]
        elif isinstance(node, nodes.Getitem):
            names = [node.arg.value] if isinstance(node.arg, nodes.Const) else []
        elif node.name in _ATTRIBUTE_FILTERS:
            constants = [*node.args, *(keyword.value for keyword in node.kwargs)]
            names = [
                part
                for constant in constants
                if isinstance(constant, nodes.Const) and isinstance(constant.value, str)
                for part in constant.value.split(".")
            ]
        else:
            names = []
        for name in names:
            if _is_escape_name(name):
                raise TemplateSecurityError(f"chat template refers to {name!r} (line {node.lineno})")


def _refuse_dunder(obj: Any, name: str) -> None:
    """Any dunder lookup is an escape attempt, except a plain dict key of that name."""
    if name.startswith("__") and not (isinstance(obj, dict) and name in obj):
        raise TemplateSecurityError(f"access to {name!r} is not allowed in a chat template")


def _runs_template_code(obj: Any) -> bool:
    """Calls that render template code (macros, caller(), a recursive loop()) can recurse."""
    return isinstance(obj, (Macro, LoopContext))


def _is_literal(node: Any) -> bool:
    return isinstance(node, (nodes.List, nodes.Tuple, nodes.Dict)) and getattr(node, "ctx", "load") == "load"


def _replace_literals(parent: nodes.Node, make_call: Callable[..., nodes.Call]) -> None:
    """Wrap every direct list/tuple/dict literal child of `parent` in a guard_literal call."""
    for field_name, value in parent.iter_fields():
        if _is_literal(value):
            setattr(parent, field_name, make_call("guard_literal", [value], value.lineno))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if _is_literal(item):
                    value[index] = make_call("guard_literal", [item], item.lineno)


def _replace_concats(parent: nodes.Node, make_call: Callable[..., nodes.Call]) -> None:
    """Replace every direct ``nodes.Concat`` child of `parent` by a guarded call.

    The call takes the Concat's own list of operands (not a copy), so a Concat nested
    in it and replaced later is replaced in the call's arguments too."""
    for field_name, value in parent.iter_fields():
        if isinstance(value, nodes.Concat):
            setattr(parent, field_name, make_call("guard_concat", value.nodes, value.lineno))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, nodes.Concat):
                    value[index] = make_call("guard_concat", item.nodes, item.lineno)


__all__ = ["GuardedEnvironment", "TemplateRefusal", "hf_tojson", "raise_exception", "strftime_now"]
