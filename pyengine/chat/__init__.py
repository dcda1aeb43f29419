"""Chat: rendering chat templates and parsing a model's replies (reasoning, tool calls).

Templates: :func:`render`, :class:`ChatTemplate` (see :mod:`pyengine.chat.template`).
Replies: :func:`parse_output`, :class:`StreamParser` / :func:`make_parser` (see
:mod:`pyengine.chat.parsers`; gpt-oss's harmony replies: :mod:`pyengine.chat.harmony`).
"""

from pyengine.chat.parsers import (
    Delta,
    ParsedOutput,
    StreamParser,
    collect,
    detect_tool_format,
    make_parser,
    parse_output,
    prompt_opens_reasoning,
    reply_format,
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
    "make_parser",
    "parse_output",
    "prompt_opens_reasoning",
    "render",
    "reply_format",
    "supports_thinking",
    "thinking_kwargs",
]
