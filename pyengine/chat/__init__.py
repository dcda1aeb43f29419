"""Chat: rendering chat templates and parsing a model's replies (reasoning, tool calls).

Templates: :func:`render`, :class:`ChatTemplate` (see :mod:`pyengine.chat.template`).
Replies: :func:`parse_output`, :class:`StreamParser` (see :mod:`pyengine.chat.parsers`).
"""

from pyengine.chat.parsers import (
    Delta,
    ParsedOutput,
    StreamParser,
    collect,
    detect_tool_format,
    parse_output,
    prompt_opens_reasoning,
)
from pyengine.chat.template import (
    FALLBACK_STOPS,
    FALLBACK_TEMPLATE,
    ChatTemplate,
    render,
    supports_thinking,
    thinking_kwargs,
)

__all__ = [
    "FALLBACK_STOPS",
    "FALLBACK_TEMPLATE",
    "ChatTemplate",
    "Delta",
    "ParsedOutput",
    "StreamParser",
    "collect",
    "detect_tool_format",
    "parse_output",
    "prompt_opens_reasoning",
    "render",
    "supports_thinking",
    "thinking_kwargs",
]
