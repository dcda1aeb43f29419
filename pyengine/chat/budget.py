"""Per-render limits for chat templates: a deadline, a size cap and a call-depth cap.

A chat template is code written by whoever published the model, so rendering one must
stop on its own. Jinja cannot be interrupted from outside without threads, so the
sandbox (see :mod:`pyengine.chat.sandbox`) calls :func:`tick` at every place a template
can spend time: each loop iteration, each call, each attribute or item lookup, each
piece of output. :func:`tick` raises :class:`~pyengine.errors.TemplateError` once the
deadline has passed. The size helpers refuse an operation *before* it builds a value
larger than the cap, so a single ``'x' * 10**12`` never allocates.

The active budget lives in a :class:`contextvars.ContextVar`, so renders on several
threads (a server) each see their own.
"""

from __future__ import annotations

import contextlib
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterator

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


@dataclass
class RenderBudget:
    """The limits of one render, and how much of them is used."""

    deadline: float
    max_chars: int
    depth: int = 0
    output_chars: int = 0
    time_limit_s: float = field(default=DEFAULT_TIME_LIMIT_S)


_ACTIVE: ContextVar[RenderBudget | None] = ContextVar("pyengine_template_budget", default=None)


@contextlib.contextmanager
def active_budget(time_limit_s: float, max_chars: int) -> Iterator[RenderBudget]:
    """Make a fresh budget the active one for the duration of the block."""
    budget = RenderBudget(time.monotonic() + time_limit_s, max_chars, time_limit_s=time_limit_s)
    token = _ACTIVE.set(budget)
    try:
        yield budget
    finally:
        _ACTIVE.reset(token)


def current() -> RenderBudget | None:
    """The active budget, or None outside a render (e.g. while compiling)."""
    return _ACTIVE.get()


def tick() -> None:
    """Raise TemplateError when the active render has run out of time."""
    budget = _ACTIVE.get()
    if budget is not None and time.monotonic() > budget.deadline:
        raise TemplateError(f"chat template took longer than {budget.time_limit_s:g} s to render")


def max_chars() -> int:
    budget = _ACTIVE.get()
    return budget.max_chars if budget is not None else DEFAULT_MAX_OUTPUT_CHARS


def refuse_size(size: int, what: str) -> None:
    """Raise TemplateError when an operation would build a value of `size` items."""
    limit = max_chars()
    if size > limit:
        raise TemplateError(f"chat template built a value too large ({what}: {size} > {limit})")


def check_value(value: Any, what: str) -> Any:
    """Pass `value` through, refusing strings and sequences over the size cap."""
    if isinstance(value, (str, bytes, list, tuple)):
        refuse_size(len(value), what)
    return value


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
