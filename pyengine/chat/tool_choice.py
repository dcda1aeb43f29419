"""OpenAI's ``tool_choice``: which tools the prompt shows, and whether the reply must call one.

* ``"none"`` hides the tools; ``"auto"`` (or nothing) lets the model choose;
* ``"required"`` and ``{"type": "function", "function": {"name": X}}`` force the reply to
  be a tool call (any of the tools, or X): generation is constrained by a grammar that
  spells one call in the syntax the reply is then parsed with, its arguments following
  the function's parameter schema.

The syntax is the template's own where a grammar can write it: Hermes/Qwen's
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` and Llama 3's bare JSON
``{"name": ..., "parameters": {...}}``. Every other template (Mistral, whose
``[TOOL_CALLS]`` is a control token a grammar cannot emit, and templates without tool
syntax, such as SmolLM2's) gets bare JSON ``{"name": ..., "arguments": {...}}``: markup
the model has never seen costs tokens and teaches nothing (``<tool_call>`` and its closer
are 10 tokens of SmolLM2's vocabulary, more than the call they wrap). The JSON is compact
(json_schema.py: at most one space after ``:`` and ``,``).
gpt-oss (harmony) forced to call one function gets the call's header in the prompt and a
grammar of the arguments alone (see session.py); "required" with several functions gets
bare JSON as above.
A function whose parameter schema the grammar converter cannot express gets arguments
that are any JSON object (the call is still forced, its name still exact). A forced
reply is exactly one call (``parallel_tool_calls`` does not add more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pyengine.chat.messages import normalize_tools
from pyengine.errors import GrammarError, InvalidOptionError
from pyengine.sample import Grammar, schema_to_grammar

_CHOICE_HELP = 'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
_ANY_OBJECT = {"type": "object"}
# How each forced syntax wraps the JSON of one call, and the key of its arguments.
_SYNTAX = {
    "hermes": ('"<tool_call>\\n"', '"\\n</tool_call>"', "arguments"),
    "llama3": ("", "", "parameters"),
    "json": ("", "", "arguments"),
}
# The parser format (chat/parsers.py) that reads each syntax back: a reply that starts with
# a JSON call is Llama 3's format, whatever the arguments' key.
_PARSE_FORMAT = {"hermes": "hermes", "llama3": "llama3", "json": "llama3"}


@dataclass(frozen=True)
class ToolChoice:
    """What a request's tools and tool_choice mean for the prompt and the reply."""

    tools: Any                          # shown to the template (None: hidden)
    forced: tuple[dict, ...] = ()       # the functions one of which the reply must call

    @property
    def is_forced(self) -> bool:
        return bool(self.forced)


def read_tool_choice(tools: Any, tool_choice: Any) -> ToolChoice:
    """Check `tool_choice` against `tools`; InvalidOptionError names what is wrong."""
    if tool_choice is None or tool_choice == "auto":
        return ToolChoice(tools)
    if tool_choice == "none":
        return ToolChoice(None)
    functions = [tool["function"] for tool in normalize_tools(tools) or []]
    if tool_choice == "required":
        if not functions:
            raise InvalidOptionError('tool_choice "required" needs at least one tool in tools')
        return ToolChoice(tools, tuple(functions))
    name = _named_function(tool_choice)
    chosen = [function for function in functions if function["name"] == name]
    if not chosen:
        known = ", ".join(repr(f["name"]) for f in functions) or "none"
        raise InvalidOptionError(f"tool_choice names function {name!r}, which is not in tools (known: {known})")
    return ToolChoice(tools, (chosen[0],))


def _named_function(tool_choice: Any) -> str:
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str) and function["name"]:
            return function["name"]
    raise InvalidOptionError(_CHOICE_HELP)


def forced_syntax(template_format: str | None) -> str:
    """The syntax a forced call is written in, given the template's tool format."""
    return template_format if template_format in ("hermes", "llama3") else "json"


def forced_parse_format(syntax: str) -> str:
    """The tool format to parse a reply forced into `syntax` with."""
    return _PARSE_FORMAT[syntax]


def forced_call_grammar(functions: tuple[dict, ...], syntax: str) -> Grammar:
    """A grammar whose sentences are exactly one call of one of `functions` in `syntax`."""
    opener, closer, arguments_key = _SYNTAX[syntax]
    calls = [_call_schema(function, arguments_key) for function in functions]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    try:
        text = schema_to_grammar(schema)
    except GrammarError:
        # a parameter schema the converter refuses: keep the exact names, free the arguments
        loose = [_call_schema(function, arguments_key, _ANY_OBJECT) for function in functions]
        text = schema_to_grammar(loose[0] if len(loose) == 1 else {"anyOf": loose})
    start = _fresh_rule_name(text, "forced-tool-call")
    body = " ".join(part for part in (opener, "root", closer) if part)
    return Grammar.from_gbnf(f"{text}\n{start} ::= {body}\n", root=start)


def forced_arguments_grammar(function: Mapping) -> Grammar:
    """A grammar of the arguments object of `function` alone (its name written before
    it, as in harmony's call header); any JSON object where the schema is beyond the
    converter."""
    parameters = function.get("parameters")
    if not isinstance(parameters, Mapping) or not parameters:
        parameters = _ANY_OBJECT
    try:
        return Grammar.from_gbnf(schema_to_grammar(dict(parameters)))
    except GrammarError:
        return Grammar.from_gbnf(schema_to_grammar(_ANY_OBJECT))


def _call_schema(function: Mapping, arguments_key: str, parameters: Any = None) -> dict:
    if parameters is None:
        parameters = function.get("parameters")
        if not isinstance(parameters, Mapping) or not parameters:
            parameters = _ANY_OBJECT
    return {"type": "object",
            "properties": {"name": {"const": function["name"]}, arguments_key: dict(parameters)},
            "required": ["name", arguments_key], "additionalProperties": False}


def _fresh_rule_name(grammar_text: str, base: str) -> str:
    name, n = base, 0
    while f"{name} ::=" in grammar_text:
        n += 1
        name = f"{base}-{n}"
    return name


__all__ = ["ToolChoice", "forced_arguments_grammar", "forced_call_grammar", "forced_parse_format", "forced_syntax",
           "read_tool_choice"]
