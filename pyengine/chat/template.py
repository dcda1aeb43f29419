"""Rendering a model's chat template (``tokenizer.chat_template`` in a GGUF).

Templates are Jinja2 source written for Hugging Face transformers, so they are rendered
the way ``apply_chat_template`` renders them: Jinja2's ``ImmutableSandboxedEnvironment``
with ``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension
(``{% break %}``, ``{% continue %}``), a ``{% generation %}`` block, the globals
``raise_exception`` and ``strftime_now``, HF's ``tojson`` filter (``ensure_ascii``,
``indent``, ``separators``, ``sort_keys``; no HTML escaping), and the variables
``messages``, ``tools``, ``documents``, ``add_generation_prompt``, ``bos_token``,
``eos_token`` plus any extra keyword (``enable_thinking``, ``date_string``, ...).

Limits: a render stops with :class:`~pyengine.errors.TemplateError` after 1.5 seconds,
once its output passes ``1_000_000 + 4 * (characters in the inputs)`` characters, or once
it grew the process by 64 MiB, whatever global, filter or operator it uses; a template
reaching outside the sandbox raises :class:`~pyengine.errors.TemplateSecurityError` (see
:mod:`pyengine.chat.sandbox`). Given a ``name`` (a model's), errors say whose template
failed: "the chat template of NAME took longer than 1.5 s to render".
Any other failure (a syntax error, ``raise_exception``, an undefined value used where
transformers fails too) raises TemplateError carrying the template's message.

Fallback: a model without a template is rendered with its family's prompt format
(``ChatTemplate.from_renderer``, see :mod:`pyengine.chat.renderers`), and ChatML
(:data:`FALLBACK_TEMPLATE`, ``ChatTemplate.fallback()``) when no family's fits. A
renderer's turn markers end the reply (:data:`FALLBACK_STOPS` for ChatML, as Ollama's
templates carry ``stop`` parameters): a vocabulary without ChatML's tags writes them as
plain text when its turn ends.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import SecurityError

from pyengine.chat import budget, renderers
from pyengine.chat.sandbox import GuardedEnvironment, TemplateRefusal
from pyengine.errors import InvalidOptionError, TemplateError, TemplateSecurityError

MAX_TEMPLATE_CHARS = 1_000_000

# ChatML, the last resort for a model without a template (its tags end a reply)
FALLBACK_STOPS = renderers.FALLBACK.stops
FALLBACK_TEMPLATE = renderers.FALLBACK.template

# Variables through which templates let the caller switch reasoning on or off.
_THINKING_SWITCHES = ("enable_thinking", "thinking", "thinking_mode", "reasoning", "thinking_budget")
_REASONING_EFFORT = "reasoning_effort"


class ChatTemplate:
    """A chat template compiled once, rendered many times (thread-safe)."""

    def __init__(
        self,
        template: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        time_limit_s: float = budget.DEFAULT_TIME_LIMIT_S,
        max_output_chars: int | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(template, str):
            raise InvalidOptionError(f"a chat template must be a string, not {type(template).__name__}")
        if len(template) > MAX_TEMPLATE_CHARS:
            raise TemplateError(f"chat template is too long ({len(template)} > {MAX_TEMPLATE_CHARS} characters)")
        self.source = template
        self.name = name   # whose template it is (a model's name), for error messages
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.time_limit_s = time_limit_s
        self.max_output_chars = max_output_chars
        self.stops: tuple[str, ...] = ()   # texts that end a reply (a renderer's turn markers)
        self.renderer: str | None = None   # the renderer's name, when the file has no template
        self._environment = GuardedEnvironment()
        with _naming(name):
            self._compiled = _compile(self._environment, template)

    @classmethod
    def fallback(cls, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """ChatML, the last resort for models that ship no template (see the module docs)."""
        return cls.from_renderer(renderers.FALLBACK, bos_token=bos_token, eos_token=eos_token)

    @classmethod
    def from_renderer(cls, renderer: renderers.Renderer, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """A family's prompt format (:mod:`pyengine.chat.renderers`), its turn markers as stops."""
        template = cls(renderer.template, bos_token=bos_token, eos_token=eos_token)
        template.stops = renderer.stops
        template.renderer = renderer.name
        return template

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render a conversation to the prompt text, as transformers would."""
        _check_conversation(messages, tools)
        variables = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "documents": None,
            **kwargs,
            "messages": list(messages),
            "tools": None if tools is None else list(tools),
            "add_generation_prompt": add_generation_prompt,
        }
        limit = self.max_output_chars
        if limit is None:
            limit = budget.DEFAULT_MAX_OUTPUT_CHARS + 4 * _input_chars(variables)
        with _naming(self.name), budget.active_budget(self.time_limit_s, limit):
            return _render(self._compiled, variables)

    @property
    def supports_thinking(self) -> bool:
        return supports_thinking(self.source)

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars)"


def render(
    template: str,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **kwargs: Any,
) -> str:
    """Render `messages` with the Jinja chat `template` (compiled templates are cached)."""
    compiled = _cached_template(template, bos_token, eos_token)
    return compiled.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)


@functools.lru_cache(maxsize=32)
def _cached_template(template: str, bos_token: str, eos_token: str) -> ChatTemplate:
    return ChatTemplate(template, bos_token=bos_token, eos_token=eos_token)


def supports_thinking(template: str) -> bool:
    """Whether the template reads a switch that turns reasoning on or off."""
    return bool(_thinking_switches(template))


def thinking_kwargs(template: str, think: bool) -> dict[str, Any]:
    """The template variables that ask this template for (or against) reasoning.

    Templates name the switch differently: ``enable_thinking`` (Qwen3, SmolLM3, GLM),
    ``thinking`` (DeepSeek V3.x, Kimi), ``thinking_mode`` (MiniMax), ``reasoning``
    (Cohere), ``thinking_budget`` (Seed-OSS, where 0 turns it off).
    """
    values: dict[str, Any] = {
        "enable_thinking": think,
        "thinking": think,
        "thinking_mode": "enabled" if think else "disabled",
        "reasoning": think,
    }
    if not think:
        values["thinking_budget"] = 0
    return {name: values[name] for name in _thinking_switches(template) if name in values}


def takes_reasoning_effort(template: str) -> bool:
    """Whether the template reads a reasoning level, ``reasoning_effort`` ("low",
    "medium", "high": gpt-oss's)."""
    return _REASONING_EFFORT in _variables(template)


@functools.lru_cache(maxsize=64)
def _thinking_switches(template: str) -> tuple[str, ...]:
    names = _variables(template)
    return tuple(name for name in _THINKING_SWITCHES if name in names)


@functools.lru_cache(maxsize=64)
def _variables(template: str) -> frozenset[str]:
    """The variables a template reads from its caller (for an unparsable one, the names
    of interest it mentions at all)."""
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(GuardedEnvironment().parse(template)))
    except jinja2.TemplateError:
        return frozenset(name for name in (*_THINKING_SWITCHES, _REASONING_EFFORT) if name in template)


# -- internals ---------------------------------------------------------------------


@contextlib.contextmanager
def _naming(name: str | None) -> Iterator[None]:
    """Say whose template failed: "chat template took too long" becomes "the chat template
    of MODEL took too long" (a message raise_exception gave is the template's own: kept)."""
    try:
        yield
    except TemplateError as exc:
        if not name or isinstance(exc, TemplateRefusal):
            raise
        message = str(exc)
        if message.startswith(_OUR_PREFIX):
            message = message[len(_OUR_PREFIX):]
        else:
            message = ": " + message
        named = type(exc)(f"the chat template of {name}{message}")
        raise named.with_traceback(None) from exc


_OUR_PREFIX = "chat template"


def _compile(environment: GuardedEnvironment, template: str) -> jinja2.Template:
    try:
        return environment.from_string(template)
    except TemplateError:
        raise  # a security refusal found while parsing
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template syntax error (line {exc.lineno}): {exc.message}") from exc
    except Exception as exc:   # foreign code: jinja2 may even emit Python that does not compile
        raise TemplateError(f"chat template does not compile: {type(exc).__name__}: {exc}") from exc


def _render(compiled: jinja2.Template, variables: dict[str, Any]) -> str:
    pieces: list[str] = []
    try:
        for piece in compiled.generate(**variables):
            budget.count_output(piece)
            pieces.append(piece)
    except TemplateError:
        raise  # ours: raise_exception, the budget, security
    except SecurityError as exc:
        raise TemplateSecurityError(f"chat template refused by the sandbox: {exc}") from exc
    except jinja2.TemplateError as exc:
        raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc.message or exc}") from exc
    except RecursionError as exc:
        raise TemplateError("chat template recursed too deeply") from exc
    except MemoryError as exc:
        raise TemplateError("chat template ran out of memory") from exc
    except Exception as exc:  # a template is foreign code: any of its errors is a TemplateError
        raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
    return "".join(pieces)


def _check_conversation(messages: Any, tools: Any) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidOptionError("messages must be a list of dicts")
    if not all(isinstance(message, Mapping) for message in messages):
        raise InvalidOptionError("each message must be a dict")
    if tools is not None:
        if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
            raise InvalidOptionError("tools must be a list of dicts")
        if not all(isinstance(tool, Mapping) for tool in tools):
            raise InvalidOptionError("each tool must be a dict")


def _input_chars(value: Any) -> int:
    """The number of characters in the strings of a nested structure (no recursion)."""
    total, pending, seen = 0, [value], 0
    while pending and seen < 1_000_000:
        item = pending.pop()
        seen += 1
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return total


__all__ = [
    "FALLBACK_STOPS",
    "FALLBACK_TEMPLATE",
    "ChatTemplate",
    "render",
    "supports_thinking",
    "takes_reasoning_effort",
    "thinking_kwargs",
]
