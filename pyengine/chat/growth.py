"""Size checks made *before* an operation that can grow a value by a large factor.

Each helper looks at the operands of one operation (a binary operator, a string method,
a filter), estimates the size of its result, and raises TemplateError through
:func:`pyengine.chat.budget.refuse_size` when that would pass the render's cap. Results
are checked again afterwards by the sandbox, so an estimate only has to catch the cases
where building the value would itself be the damage (memory, time).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sized
from typing import Any, Callable

from pyengine.chat import budget
from pyengine.errors import TemplateError, TemplateSecurityError

_SIZED = (str, bytes, list, tuple)
# A big integer costs time to multiply and to print; 10**30000 is already absurd.
_MAX_POWER_BITS = 100_000

# Filters that loop in Python over their input's words or characters, with no tick inside:
# one call on a capped-size value could still outlast the deadline (wordwrap of 1M
# characters took 3.7 s), so their input is capped at what a call does in ~0.1 s. Chat
# templates give them role names and short texts.
_TEXT_FILTER_LIMITS = {
    "wordwrap": 20_000, "urlize": 20_000, "pprint": 20_000,
    "title": 100_000, "striptags": 100_000, "wordcount": 100_000, "urlencode": 100_000,
    "xmlattr": 10_000,
}
# Filters that do Python work per item (a key function, a group, a batch); a string's items
# are its characters.
_ITEM_FILTER_LIMIT = 100_000
_ITEM_FILTERS = frozenset({
    "sort", "unique", "dictsort", "groupby", "batch", "slice", "sum", "min", "max", "list",
    "map", "select", "reject", "selectattr", "rejectattr",
})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse `left operator right` when it would build a huge value."""
    if operator == "*":
        _check_product(left, right)
        _check_repeat(left, right)
        _check_repeat(right, left)
    elif operator == "+":
        if isinstance(left, _SIZED) and isinstance(right, _SIZED):
            budget.refuse_size(len(left) + len(right), "'+'")
    elif operator == "**":
        _check_power(left, right)
    elif operator == "%" and isinstance(left, str):
        _check_percent_format(left, right)


def _check_product(left: Any, right: Any) -> None:
    """Repeated squaring doubles an integer's size each time: refuse huge products."""
    if _is_int(left) and _is_int(right):
        bits = left.bit_length() + right.bit_length()
        if bits > _MAX_POWER_BITS:
            raise TemplateError(f"chat template computed a number of about {bits} bits with '*'")


def _check_repeat(sequence: Any, count: Any) -> None:
    if isinstance(sequence, _SIZED) and _is_int(count):
        budget.refuse_size(len(sequence) * max(count, 0), "'*'")


def _check_power(base: Any, exponent: Any) -> None:
    if _is_int(base) and _is_int(exponent) and exponent > 0 and abs(base) > 1:
        bits = base.bit_length() * exponent
        if bits > _MAX_POWER_BITS:
            raise TemplateError(f"chat template computed a number of about {bits} bits with '**'")


def check_format_expansion(fmt: Any, values: tuple, marker: str, what: str) -> None:
    """Refuse a format whose fields, each at most the largest value's text, would pass the
    cap: '{0}' written 250000 times over a 1 MB string asks for 250 GB."""
    if not isinstance(fmt, str):
        return
    fields = fmt.count(marker)
    if fields == 0:
        return
    limit = budget.max_chars() + 1
    largest = max((budget.printed_size(value, limit) for value in values), default=0)
    budget.refuse_size(len(fmt) + fields * largest, what)


def _format_values(values: Any) -> tuple:
    if isinstance(values, tuple):
        return values
    if isinstance(values, dict):
        return tuple(values.values())
    return (values,)


def _check_percent_format(fmt: str, values: Any) -> None:
    budget.check_format_string(fmt, "'%'")
    check_format_expansion(fmt, _format_values(values), "%", "'%'")
    if isinstance(values, tuple):
        budget.check_int_args(values, {}, "'%'")
    elif isinstance(values, dict):
        budget.check_int_args((), values, "'%'")
    else:
        budget.check_int_args((values,), {}, "'%'")


def replace_size(text: str, old: Any, new: Any, count: Any = -1) -> int:
    """The length of text.replace(old, new, count), computed without replacing."""
    if not isinstance(old, str) or not isinstance(new, str):
        return len(text)
    occurrences = len(text) + 1 if old == "" else text.count(old)
    if _is_int(count) and count >= 0:
        occurrences = min(occurrences, count)
    return len(text) + occurrences * (len(new) - len(old))


def join_size(separator: Any, items: Any) -> int:
    """A lower estimate of the length of separator.join(items) for sized items
    (the separators alone, plus the strings of a list)."""
    if not isinstance(items, Sized):
        return 0
    sep_len = len(separator) if isinstance(separator, str) else 0
    item_chars = sum(len(item) for item in items if isinstance(item, str)) if isinstance(items, (list, tuple)) else 0
    return item_chars + max(len(items) - 1, 0) * sep_len


def sized(items: Any) -> Any:
    """`items` itself when it has a length, else its items in a list, so that the
    size of a join over a generator can be estimated before joining."""
    if isinstance(items, Sized) or not isinstance(items, Iterable):
        return items
    materialized = []
    for item in items:
        budget.tick()
        materialized.append(item)
    return materialized


def check_str_method(method: Callable[..., Any], args: tuple, kwargs: dict) -> tuple:
    """Refuse a call of a str/bytes/list method that would build a huge value; return
    the arguments to call it with (a generator given to str.join comes back as a list)."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    if not isinstance(owner, (str, bytes, list, tuple)):
        return args
    budget.check_int_args(args, kwargs, f"str.{name}")
    if not isinstance(owner, str):
        return args
    if name == "replace" and len(args) >= 2:
        budget.refuse_size(replace_size(owner, *args[:3]), "str.replace")
    elif name == "join" and args:
        args = (sized(args[0]), *args[1:])
        budget.refuse_size(join_size(owner, args[0]), "str.join")
    elif name == "expandtabs":
        tab_size = args[0] if args else kwargs.get("tabsize", 8)
        if _is_int(tab_size):
            budget.refuse_size(len(owner) + owner.count("\t") * tab_size, "str.expandtabs")
    elif name in ("format", "format_map"):
        budget.check_format_string(owner, f"str.{name}")
        values = tuple(args) + tuple(kwargs.values())
        values += tuple(v for arg in args if isinstance(arg, dict) for v in arg.values())
        check_format_expansion(owner, values, "{", f"str.{name}")
        for arg in args:
            if isinstance(arg, dict):
                budget.check_int_args((), arg, f"str.{name}")
    return args


def check_filter(name: str, args: tuple, kwargs: dict) -> None:
    """Refuse a filter call (args[0] is the filtered value) that would build a huge value
    or loop in Python for long."""
    value, extra = (args[0], args[1:]) if args else (None, ())
    _check_filter_work(name, value)
    budget.check_int_args(extra, kwargs, f"filter {name!r}")
    if name == "attr" and extra and isinstance(extra[0], str) and extra[0].startswith("__"):
        raise TemplateSecurityError(f"access to attribute {extra[0]!r} is not allowed in a chat template")
    if name == "sum":
        start = extra[1] if len(extra) > 1 else kwargs.get("start", 0)
        if not isinstance(start, (int, float)):
            # summing lists copies the total so far at every item: quadratic
            raise TemplateError(f"chat template asked filter 'sum' to start from a {type(start).__name__}")
    if name == "replace" and isinstance(value, str) and len(extra) >= 2:
        budget.refuse_size(replace_size(value, *extra[:3]), "filter 'replace'")
    elif name == "join" and isinstance(value, Sized):
        separator = extra[0] if extra else kwargs.get("d", "")
        budget.refuse_size(join_size(separator, value), "filter 'join'")
    elif name == "indent" and isinstance(value, str):
        width = extra[0] if extra else kwargs.get("width", 4)
        width_chars = len(width) if isinstance(width, str) else width if _is_int(width) else 0
        budget.refuse_size(len(value) + (value.count("\n") + 1) * width_chars, "filter 'indent'")
    elif name == "format":
        budget.check_format_string(value, "filter 'format'")
        check_format_expansion(value, tuple(extra) + tuple(kwargs.values()), "%", "filter 'format'")
    elif name == "tojson":
        _check_tojson(value, extra, kwargs)


def _check_filter_work(name: str, value: Any) -> None:
    limit = _TEXT_FILTER_LIMITS.get(name)
    if limit is None and name in _ITEM_FILTERS:
        limit = _ITEM_FILTER_LIMIT
    if limit is None:
        return
    size = _nodes_up_to(value, limit + 1) if name == "pprint" else len(value) if isinstance(value, Sized) else 0
    if size > limit:
        raise TemplateError(f"chat template gave filter {name!r} a value of more than {limit} items or characters")


def _nodes_up_to(value: Any, limit: int) -> int:
    """Items and characters in a nested value, counted up to `limit`."""
    total, pending = 0, [value]
    while pending and total < limit:
        item = pending.pop()
        if isinstance(item, (str, bytes)):
            total += len(item) + 1
        elif isinstance(item, dict):
            total += 1
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 1
            pending.extend(item)
        else:
            total += 1
    return total


def _check_tojson(value: Any, extra: tuple, kwargs: dict) -> None:
    indent = extra[1] if len(extra) > 1 else kwargs.get("indent")
    width = len(indent) if isinstance(indent, str) else indent if _is_int(indent) else 0
    if width <= 1:
        return
    try:
        compact = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return  # the real call will report the error
    # every character could start a line, each indented at least once more
    budget.refuse_size(len(compact) * width, "filter 'tojson'")
