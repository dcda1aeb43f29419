"""Chat: rendering chat templates and parsing a model's replies (reasoning, tool calls)."""

from pyengine.chat.template import (
    FALLBACK_TEMPLATE,
    ChatTemplate,
    render,
    supports_thinking,
    thinking_kwargs,
)

__all__ = [
    "FALLBACK_TEMPLATE",
    "ChatTemplate",
    "render",
    "supports_thinking",
    "thinking_kwargs",
]
