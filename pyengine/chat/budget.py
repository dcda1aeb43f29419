"""Per-render limits for chat templates: a deadline, a size cap and a call-depth cap.

A chat template is code written by whoever published the model, so rendering one must
stop on its own, in time and in memory. Jinja cannot be interrupted from outside without threads, so the
sandbox (see :mod:`pyengine.chat.sandbox`) calls :func:`tick` at every place a template
can spend time: each loop iteration, each call, each attribute or item lookup, each
piece of output. :func:`tick` raises :class:`~pyengine.errors.TemplateError` once the
deadline has passed. The size helpers refuse an operation *before* it builds a value
larger than the cap, so a single ``'x' * 10**12`` never allocates.

Memory: every value the sandbox sees built (call and filter results, operators, output
pieces, in any buffer) is charged by its size; each few MiB charged, and every few
milliseconds of a render, the process's anonymous resident memory is read, and a render
that grew it by more than :data:`MAX_MEMORY_GROWTH` stops. Charges alone never stop a
render (most of what is charged is garbage soon freed); the measured growth does.

The active budget lives in a :class:`contextvars.ContextVar`, so renders on several
threads (a server) each see their own.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import ItemsView, KeysView, ValuesView
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterator

from jinja2.utils import Namespace

from pyengine.errors import TemplateError

# The brief is "a render returns within 2 s": the deadline leaves room for compiling
# the template and unwinding the render.
DEFAULT_TIME_LIMIT_S = 1.5
DEFAULT_MAX_OUTPUT_CHARS = 1_000_000
# Legitimate templates nest macro calls a few levels deep (JSON-schema printers);
# each Jinja call costs several Python frames, so keep well under the interpreter's
# own recursion limit.
MAX_CALL_DEPTH = 48
# A format width or precision written with this many digits asks for >= 1 MB of padding.
_HUGE_WIDTH = re.compile(r"\d{7,}")
# Output written into set blocks, macros and the result together, per character of the output cap.
WRITTEN_FACTOR = 16
# How much a render may grow the process's memory, and how often that is measured.
MAX_MEMORY_GROWTH = 64 * 2**20
_MEMORY_CHECK_BYTES = 4 * 2**20    # after this many bytes charged
_MEMORY_CHECK_S = 0.01             # or this long, once the render has built 1 MiB
_MEMORY_CHECK_MIN_CHARGED = 2**20
# Where the process's resident memory cannot be read, charges count as growth, with room
# for the garbage among them.
_CHARGED_LIMIT_WITHOUT_RSS = 4 * MAX_MEMORY_GROWTH


@dataclass
class RenderBudget:
    """The limits of one render, and how much of them is used."""

    deadline: float
    max_chars: int
    depth: int = 0
    output_chars: int = 0
    time_limit_s: float = field(default=DEFAULT_TIME_LIMIT_S)
    written_chars: int = 0                # output pieces, in every buffer (set blocks, macros)
    # printed sizes of the containers checked so far: id -> (the container, kept alive; size)
    printed: dict[int, tuple[Any, int]] = field(default_factory=dict)
    memory_at_start: int | None = None    # anonymous resident bytes, None where unknown
    charged: int = 0                      # bytes of values built so far
    next_check_charge: int = _MEMORY_CHECK_BYTES
    next_check_time: float = 0.0


_ACTIVE: ContextVar[RenderBudget | None] = ContextVar("pyengine_template_budget", default=None)


@contextlib.contextmanager
def active_budget(time_limit_s: float, max_chars: int) -> Iterator[RenderBudget]:
    """Make a fresh budget the active one for the duration of the block."""
    now = time.monotonic()
    budget = RenderBudget(now + time_limit_s, max_chars, time_limit_s=time_limit_s,
                          memory_at_start=_anonymous_rss(), next_check_time=now + _MEMORY_CHECK_S)
    token = _ACTIVE.set(budget)
    try:
        yield budget
    finally:
        _ACTIVE.reset(token)


def current() -> RenderBudget | None:
    """The active budget, or None outside a render (e.g. while compiling)."""
    return _ACTIVE.get()


def tick() -> None:
    """Raise TemplateError when the active render has run out of time (or memory)."""
    budget = _ACTIVE.get()
    if budget is None:
        return
    now = time.monotonic()
    if now > budget.deadline:
        raise TemplateError(f"chat template took longer than {budget.time_limit_s:g} s to render")
    if now > budget.next_check_time and budget.charged >= _MEMORY_CHECK_MIN_CHARGED:
        budget.next_check_time = now + _MEMORY_CHECK_S
        _check_memory(budget)


def charge(value: Any) -> None:
    """Count a value the render built towards its memory; measure the memory now and then."""
    budget = _ACTIVE.get()
    if budget is None:
        return
    budget.charged += _size_of(value)
    if budget.charged >= budget.next_check_charge:
        budget.next_check_charge = budget.charged + _MEMORY_CHECK_BYTES
        _check_memory(budget)


def count_written(piece: str) -> None:
    """Account for one piece of output in any buffer. Pieces can all be the same big
    string, so their sum, not the memory they hold, is what a set block or a macro
    joins: the sum over the render is capped at WRITTEN_FACTOR times the output cap
    (macros nest, and each level writes its callee's output again)."""
    budget = _ACTIVE.get()
    if budget is None:
        return
    budget.written_chars += len(piece)
    limit = WRITTEN_FACTOR * budget.max_chars
    if budget.written_chars > limit:
        raise TemplateError(f"chat template wrote more than {limit} characters into its output, "
                            f"blocks and macros")


def _size_of(value: Any) -> int:
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        return sys.getsizeof(value)
    return 0


def _check_memory(budget: RenderBudget) -> None:
    if budget.memory_at_start is None:
        grown = budget.charged - _CHARGED_LIMIT_WITHOUT_RSS + MAX_MEMORY_GROWTH
    else:
        now = _anonymous_rss()
        grown = 0 if now is None else now - budget.memory_at_start
    if grown > MAX_MEMORY_GROWTH:
        raise TemplateError(
            f"chat template used more than {MAX_MEMORY_GROWTH // 2**20} MiB of memory to render")


def _anonymous_rss() -> int | None:
    """The process's resident memory less the file-backed pages (the model's mapped
    weights come and go with the page cache); None where /proc is not there."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            fields = statm.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def max_chars() -> int:
    budget = _ACTIVE.get()
    return budget.max_chars if budget is not None else DEFAULT_MAX_OUTPUT_CHARS


def refuse_size(size: int, what: str) -> None:
    """Raise TemplateError when an operation would build a value of `size` items."""
    limit = max_chars()
    if size > limit:
        raise TemplateError(f"chat template built a value too large ({what}: {size} > {limit})")


def check_value(value: Any, what: str) -> Any:
    """Pass `value` through, refusing strings over the size cap, and containers whose text
    (what printing them would write, shared items counted each time) would pass it."""
    if isinstance(value, (str, bytes)):
        refuse_size(len(value), what)
    elif isinstance(value, (*_CONTAINERS, *_VIEWS, Namespace)):
        limit = max_chars()
        refuse_size(printed_size(value, limit + 1), what)
    charge(value)
    return value


def check_joined(left: Any, right: Any, what: str) -> None:
    """Refuse left + right of two containers by their known printed sizes (a list grown
    one item at a time in a loop is not walked again each time)."""
    refuse_size(printed_size(left, max_chars() + 1) + printed_size(right, max_chars() + 1), what)


def remember_sum(result: Any, left: Any, right: Any) -> None:
    budget = _ACTIVE.get()
    if budget is not None:
        size = printed_size(left, budget.max_chars + 1) + printed_size(right, budget.max_chars + 1)
        _remember(budget, result, size)


_CONTAINERS = (list, tuple, dict, set, frozenset)
# printed with all their items, like the containers
_VIEWS = (KeysView, ValuesView, ItemsView)


def _namespace_items(item: Any) -> dict | None:
    """The attributes of a Jinja namespace() (printed by its repr), else None."""
    if isinstance(item, Namespace):
        try:
            return object.__getattribute__(item, "_Namespace__attrs")
        except AttributeError:
            return None
    return None


def printed_size(value: Any, limit: int) -> int:
    """About how many characters str(value) has, counted up to `limit` (no recursion:
    containers nest; each item once per place it appears, as printing repeats it)."""
    budget = _ACTIVE.get()
    known = budget.printed if budget is not None else {}
    total, pending = 0, [value]
    while pending and total < limit:
        item = pending.pop()
        if isinstance(item, (str, bytes)):
            total += len(item) + 2
        elif id(item) in known and known[id(item)][0] is item:
            total += known[id(item)][1]
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (*_CONTAINERS, *_VIEWS)):
            total += 2 + 2 * len(item)
            pending.extend(item)
        elif isinstance(item, Namespace):
            total += 16
            attrs = _namespace_items(item)
            if attrs is not None:
                pending.append(attrs)
        elif isinstance(item, int) and not isinstance(item, bool):
            total += item.bit_length() // 3 + 1
        else:
            total += 4
    if budget is not None and isinstance(value, _CONTAINERS) and total < limit:
        _remember(budget, value, total)
    return total


_REMEMBERED = 64   # containers kept alive for their sizes: the latest few are the ones reused


def _remember(budget: RenderBudget, value: Any, size: int) -> None:
    known = budget.printed
    if len(known) >= _REMEMBERED:
        del known[next(iter(known))]
    known[id(value)] = (value, size)


def check_int_args(args: tuple, kwargs: dict, what: str) -> None:
    """Refuse integer arguments large enough to be widths or counts of a huge value."""
    limit = max_chars()
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > limit:
            raise TemplateError(f"chat template passed a huge number to {what}")


def check_format_string(fmt: Any, what: str) -> None:
    """Refuse %- or {}-format strings that ask for a width or precision of millions."""
    if isinstance(fmt, str) and _HUGE_WIDTH.search(fmt):
        raise TemplateError(f"chat template asked {what} for a huge width")


@contextlib.contextmanager
def nested_call() -> Iterator[None]:
    """Count one level of template-code nesting (a macro, caller(), a recursive loop)."""
    budget = _ACTIVE.get()
    if budget is None:
        yield
        return
    if budget.depth >= MAX_CALL_DEPTH:
        raise TemplateError(f"chat template recursed deeper than {MAX_CALL_DEPTH} calls")
    budget.depth += 1
    try:
        yield
    finally:
        budget.depth -= 1


def count_output(piece: str) -> None:
    """Account for one piece of top-level output; refuse output over the cap."""
    budget = _ACTIVE.get()
    if budget is None:
        return
    budget.output_chars += len(piece)
    if budget.output_chars > budget.max_chars:
        raise TemplateError(f"chat template output exceeds {budget.max_chars} characters")
    if time.monotonic() > budget.deadline:
        raise TemplateError(f"chat template took longer than {budget.time_limit_s:g} s to render")
