"""gpt-oss's harmony format: reading a reply's channels as reasoning, tool calls and content.

A harmony reply is a run of messages. The prompt ends with ``<|start|>assistant``, so
the first message starts with its header at once; later ones start with
``<|start|>assistant``. A message is a header, ``<|message|>``, a body and a terminator::

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is 9 °C in Oslo.<|return|>

The header names the channel and, for a tool call, the recipient (``to=``, before or
after the channel) and the arguments' type (``<|constrain|>json`` or a bare ``json``).
Bodies are read by channel: ``analysis`` is reasoning, ``final`` is content, a message
with a recipient is a tool call (``functions.NAME`` calls NAME; a built-in tool such as
``browser.search`` keeps its name), and ``commentary`` without one (a preamble the
model shows the user) is content, as is a channel harmony does not define. Calls are
read whether or not the request offered tools: the header, not a marker in the text,
says a message is one.
``<|end|>`` ends a message, ``<|call|>`` and ``<|return|>`` end the generation
(:data:`HARMONY_STOPS`; the vocabulary marks them end-of-generation, so they are
usually not in the text at all and the reply's end closes its last message).

Nothing here raises on model output. A header that cannot be one (text that is not
harmony at all, a header cut by a terminator before ``<|message|>``, one longer than
:data:`MAX_HEADER_CHARS`) is content, markers included, as is a call whose body is not
a JSON object. Text outside any message is content; stray terminators are dropped.

Streaming: every decision depends only on text already seen and never on where the
pieces were split, so :class:`HarmonyParser` fed piece by piece adds up to the result
of feeding it the whole reply at once (see :func:`pyengine.chat.parsers.parse_output`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pyengine.chat.deltas import Delta, earliest_marker, partial_marker_length
from pyengine.chat.toolcalls import make_tool_call
from pyengine.errors import InvalidOptionError

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
HARMONY_STOPS = (RETURN, CALL)
MAX_HEADER_CHARS = 256
# Written after the prompt when the answer's form is constrained (a JSON format): the
# grammar then shapes the final message, not the headers of the channels before it.
FINAL_OPENER = CHANNEL + "final" + MESSAGE

_TERMINATORS = (END, CALL, RETURN)
_HEADER_ENDS = (MESSAGE, START, *_TERMINATORS)
_BODY_ENDS = (START, CHANNEL, *_TERMINATORS)  # a new header also ends a body the model did not close
_HEADER_OPENINGS = (CHANNEL, "to=", "assistant")
_SPACE = " \t\r\n"
_HEADER = re.compile(
    r"\s*(?:assistant)?"
    r"(?:\s*to=(?P<before>[^\s<]+))?"
    r"(?:\s*<\|channel\|>(?P<channel>[A-Za-z0-9_]+))?"
    r"(?:\s*to=(?P<after>[^\s<]+))?"
    r"(?:\s*(?:<\|constrain\|>\s*)?(?P<type>[A-Za-z0-9_./+-]+))?"
    r"\s*\Z"
)

# parser states
_IN_HEADER, _IN_BODY, _BETWEEN, _PLAIN = "header", "body", "between", "plain"


def is_harmony_template(template: str | None) -> bool:
    """Whether a chat template writes harmony's messages (gpt-oss's)."""
    return bool(template) and all(marker in template for marker in (START, CHANNEL, MESSAGE))


@dataclass(frozen=True)
class Header:
    """What a message header says: its channel, whom it is addressed to, the body's type."""

    channel: str | None
    recipient: str | None
    content_type: str | None


def read_header(text: str) -> Header | None:
    """The header between ``<|start|>`` (or the reply's start) and ``<|message|>``, or
    None when `text` is not a harmony header."""
    match = _HEADER.match(text)
    if match is None:
        return None
    recipient = match.group("before") or match.group("after")
    if match.group("type") and not recipient:   # only a call's arguments have a type
        return None
    if recipient == "assistant":  # a tool's answer addressed back: no call
        recipient = None
    return Header(match.group("channel"), recipient, match.group("type"))


def harmony_call_header(name: str) -> str:
    """The header of a message that calls function `name` (its JSON arguments follow)."""
    return f"{CHANNEL}commentary to=functions.{name} {CONSTRAIN}json{MESSAGE}"


def opened_header(prompt: str | None) -> Header | None:
    """The header of the assistant message a prompt leaves open (it ends with
    ``<|message|>``, as one that :data:`FINAL_OPENER` was written after), or None."""
    if not prompt or not prompt.endswith(MESSAGE):
        return None
    start = prompt.rfind(START)
    if start < 0:
        return None
    return read_header(prompt[start + len(START):-len(MESSAGE)])


def _could_start_header(text: str) -> bool:
    """Whether `text` (a header's settled part) can still grow into a header."""
    head = text.lstrip(_SPACE)
    if len(text) > MAX_HEADER_CHARS or "\n" in head:
        return False
    return any(head.startswith(opening) or opening.startswith(head) for opening in _HEADER_OPENINGS)


def _function_name(recipient: str) -> str:
    return recipient.removeprefix("functions.")


class HarmonyParser:
    """Incremental harmony reader with :class:`~pyengine.chat.parsers.StreamParser`'s
    interface: ``push`` pieces, then ``finish``; each returns the deltas now certain.
    `reasoning` False puts the analysis channel into the content. `opened`: the header
    of a message the prompt already opened (:func:`opened_header`); the reply then
    starts inside its body, otherwise (the prompt ended with ``<|start|>assistant``)
    with a header."""

    def __init__(self, reasoning: bool = True, opened: Header | None = None) -> None:
        self._reasoning = reasoning
        self._buffer = ""
        self._state = _IN_HEADER if opened is None else _IN_BODY
        self._opener = ""          # the marker that opened the current header ("" or <|start|>)
        self._header_text = ""     # the current message's raw header (for a call that fails)
        self._header = opened
        self._deltas: list[Delta] = []
        self._finished = False

    @property
    def in_reasoning(self) -> bool:
        """Whether the reply is inside an analysis message."""
        return self._state == _IN_BODY and self._body_kind() == "reasoning"

    def push(self, text: str) -> list[Delta]:
        if self._finished:
            raise InvalidOptionError("push() after finish()")
        if not isinstance(text, str):
            raise InvalidOptionError(f"push() takes text, not {type(text).__name__}")
        self._buffer += text
        self._advance(final=False)
        return self._take()

    def finish(self) -> list[Delta]:
        if self._finished:
            return []
        self._advance(final=True)
        self._finished = True
        return self._take()

    # -- the state machine ---------------------------------------------------------

    def _advance(self, final: bool) -> None:
        steps = {_IN_HEADER: self._step_header, _IN_BODY: self._step_body, _BETWEEN: self._step_between,
                 _PLAIN: self._step_plain}
        while steps[self._state](final):
            pass

    def _step_header(self, final: bool) -> bool:
        found = earliest_marker(self._buffer, _HEADER_ENDS)
        if found is None:
            settled = len(self._buffer) - (0 if final else partial_marker_length(self._buffer, _HEADER_ENDS))
            if not _could_start_header(self._buffer[:settled]):
                return self._not_a_header()
            if final:
                return self._header_cut_off()
            return False
        index, marker = found
        header_text = self._buffer[:index]
        header = read_header(header_text) if _could_start_header(header_text) else None
        if marker != MESSAGE or header is None:
            return self._not_a_header()
        self._header_text = self._opener + header_text + MESSAGE
        self._header = header
        self._buffer = self._buffer[index + len(marker):]
        self._state = _IN_BODY
        return True

    def _not_a_header(self) -> bool:
        """What was taken for a header is text: it is content, read on as plain text."""
        self._add("content", self._opener)
        self._opener = ""
        self._state = _PLAIN
        return True

    def _header_cut_off(self) -> bool:
        """The reply ended inside a header: a header's beginning says nothing, other text is content."""
        if self._buffer.strip(_SPACE) and read_header(self._buffer) is None:
            self._add("content", self._opener + self._buffer)
        self._buffer = ""
        return False

    def _step_body(self, final: bool) -> bool:
        kind = self._body_kind()
        found = earliest_marker(self._buffer, _BODY_ENDS)
        if found is None:
            if not final:
                if kind != "tool_call":   # a call is emitted whole, once its body ends
                    cut = len(self._buffer) - partial_marker_length(self._buffer, _BODY_ENDS)
                    self._add(kind, self._buffer[:cut])
                    self._buffer = self._buffer[cut:]
                return False
            index, marker = len(self._buffer), ""
        else:
            index, marker = found
        self._end_body(kind, self._buffer[:index])
        self._buffer = self._buffer[index + len(marker):]
        self._after_marker(marker)
        return bool(marker)

    def _end_body(self, kind: str, text: str) -> None:
        if kind != "tool_call":
            self._add(kind, text)
            return
        call = self._call(text)
        if call is None:   # not a call after all: its text, header included, is content
            self._add("content", self._header_text + text)
        else:
            self._deltas.append(Delta("tool_call", tool_call=call))

    def _call(self, body: str) -> dict | None:
        assert self._header is not None and self._header.recipient is not None
        try:
            arguments = json.loads(body) if body.strip(_SPACE) else {}
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        return make_tool_call(_function_name(self._header.recipient), arguments)

    def _after_marker(self, marker: str) -> None:
        """Where reading goes on after the marker that ended a body or plain text."""
        self._header = None
        if marker == START:
            self._state, self._opener = _IN_HEADER, START
        elif marker == CHANNEL:   # a header without <|start|>: the marker is part of it
            self._buffer = CHANNEL + self._buffer
            self._state, self._opener = _IN_HEADER, ""
        else:
            self._state = _BETWEEN

    def _step_between(self, final: bool) -> bool:
        """After a terminator: the next message's header, or (against the format) text."""
        rest = self._buffer.lstrip(_SPACE)
        if not rest:
            self._buffer = ""
            return False
        if rest.startswith((START, CHANNEL)):
            self._opener = START if rest.startswith(START) else ""   # <|channel|> is part of the header
            self._buffer = rest.removeprefix(START)
            self._state = _IN_HEADER
            return True
        if not final and (START.startswith(rest) or CHANNEL.startswith(rest)):
            return False
        self._buffer = rest
        self._state = _PLAIN
        return True

    def _step_plain(self, final: bool) -> bool:
        """Text outside any message: content until a message starts (or a terminator)."""
        markers = (START, *_TERMINATORS)
        found = earliest_marker(self._buffer, markers)
        if found is None:
            cut = len(self._buffer) - (0 if final else partial_marker_length(self._buffer, markers))
            self._add("content", self._buffer[:cut])
            self._buffer = self._buffer[cut:]
            return False
        index, marker = found
        self._add("content", self._buffer[:index])
        self._buffer = self._buffer[index + len(marker):]
        self._after_marker(marker)
        return True

    def _body_kind(self) -> str:
        header = self._header
        if header is None:
            return "content"
        if header.recipient is not None:
            return "tool_call"
        if header.channel == "analysis" and self._reasoning:
            return "reasoning"
        return "content"   # final, a preamble on commentary, or a channel harmony does not have

    # -- output ----------------------------------------------------------------------

    def _add(self, kind: str, text: str) -> None:
        if not text:
            return
        if self._deltas and self._deltas[-1].kind == kind:
            self._deltas[-1] = Delta(kind, self._deltas[-1].text + text)
        else:
            self._deltas.append(Delta(kind, text))

    def _take(self) -> list[Delta]:
        deltas, self._deltas = self._deltas, []
        return deltas


__all__ = ["FINAL_OPENER", "HARMONY_STOPS", "MAX_HEADER_CHARS", "HarmonyParser", "Header", "harmony_call_header",
           "is_harmony_template", "opened_header", "read_header"]
