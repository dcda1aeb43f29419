"""Splitting a model's reply into reasoning, content and tool calls, whole or streamed.

Reasoning blocks: ``<think>...</think>`` and the other common pairs in
:data:`REASONING_MARKERS` (``[THINK]...[/THINK]``, ``<reasoning>``, Cohere's and
Seed's markers, gpt-oss's ``<|channel|>analysis<|message|>...<|end|>``). When the chat
template already opened the block in the prompt (DeepSeek-R1, GLM...), create the parser
with ``starts_in_reasoning=True`` (:func:`prompt_opens_reasoning` tells).

Tool calls, by the format :func:`detect_tool_format` reads off the chat template:

* ``"hermes"``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes,
  Qwen2.5/3), also with the XML body ``<function=name><parameter=k>v</parameter>``
  (Qwen3-Coder, Qwen3.5, Nemotron 3);
* ``"llama3"``: a reply that starts with ``{"name": ..., "parameters": {...}}``, or
  ``<|python_tag|>`` followed by such JSON, a built-in ``tool.call(k=v)`` or code;
* ``"mistral"``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` or
  ``[TOOL_CALLS]name[ARGS]{...}``;
* ``"harmony"`` (gpt-oss): the whole reply is channelled messages, read by
  :class:`~pyengine.chat.harmony.HarmonyParser` (analysis, tool calls, final) with or
  without tools; :func:`reply_format` picks it and :func:`make_parser` builds it.

Calls come out in OpenAI's shape: ``{"id": "call_...", "type": "function",
"function": {"name": ..., "arguments": "<json string>"}}``. A block that does not
parse stays in the content, markers included; nothing here raises on model output.

Whitespace: reasoning is stripped at both ends, and whitespace between a block and the
text around it is dropped; other text is passed through unchanged.

Streaming: :class:`StreamParser` emits each piece as soon as it is certain. Text that
could be the start of a marker (``"<thi"``) is held back until the next piece settles
it, and a tool call is emitted whole once its block is complete. Parsing in one go
(:func:`parse_output`) is the same machine fed a single piece, so a streamed reply
always adds up to the one-shot result.
"""

from __future__ import annotations

from pyengine.chat.collectors import HermesCollector, JsonCallCollector, MistralCollector, collector_for
from pyengine.chat.deltas import Delta, ParsedOutput, collect, earliest_marker, partial_marker_length
from pyengine.chat.harmony import HarmonyParser, is_harmony_template, opened_header
from pyengine.errors import InvalidOptionError

REASONING_MARKERS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<thinking>", "</thinking>"),
    ("<reasoning>", "</reasoning>"),
    ("[THINK]", "[/THINK]"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("<seed:think>", "</seed:think>"),
    ("<|channel|>analysis<|message|>", "<|end|>"),
)
# gpt-oss frames its final answer with these; they are neither reasoning nor content.
_DROPPED_MARKERS = ("<|start|>assistant", "<|channel|>final<|message|>", "<|return|>")
_TOOL_OPENERS = {
    "hermes": (HermesCollector.opener,),
    "llama3": ("<|python_tag|>",),
    "mistral": (MistralCollector.opener,),
}
HARMONY = "harmony"  # gpt-oss: the whole reply is channels (pyengine.chat.harmony reads it)
TOOL_FORMATS = (*_TOOL_OPENERS, HARMONY)
_CLOSER_OF = dict(REASONING_MARKERS)
_SPACE = " \t\r\n"


def detect_tool_format(template: str | None) -> str | None:
    """The tool-call format a chat template teaches its model, or None if none is known."""
    if not template:
        return None
    if is_harmony_template(template):
        return HARMONY
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and '"parameters"' in template):
        return "llama3"
    return None


def reply_format(template: str | None, has_tools: bool) -> str | None:
    """The format a reply is read in: harmony's for a harmony template whatever the
    request (every message it writes has a channel), else the template's tool-call format
    when tools were given, else None (reasoning markers only)."""
    if is_harmony_template(template):
        return HARMONY
    return detect_tool_format(template) if has_tools else None


def make_parser(reasoning: bool = True, tool_format: str | None = None, starts_in_reasoning: bool = False,
                prompt: str | None = None) -> StreamParser | HarmonyParser:
    """The incremental parser for replies in `tool_format` (see :func:`reply_format`). A
    harmony reply opens its channels itself: instead of `starts_in_reasoning`, the end of
    the rendered `prompt` tells whether it left a message open."""
    if tool_format == HARMONY:
        return HarmonyParser(reasoning=reasoning, opened=opened_header(prompt))
    return StreamParser(reasoning=reasoning, tool_format=tool_format, starts_in_reasoning=starts_in_reasoning)


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether a rendered prompt ends inside an opened reasoning block (the model's
    reply then starts with reasoning and only closes it)."""
    tail = prompt.rstrip(_SPACE)
    return any(tail.endswith(opener) for opener, _ in REASONING_MARKERS)


def parse_output(
    text: str,
    *,
    reasoning: bool = True,
    tool_format: str | None = None,
    starts_in_reasoning: bool = False,
) -> ParsedOutput:
    """Split a complete reply into content, reasoning and tool calls."""
    parser = make_parser(reasoning=reasoning, tool_format=tool_format, starts_in_reasoning=starts_in_reasoning)
    return collect(parser.push(text) + parser.finish())


class _Emitter:
    """Builds the deltas of one push, applying the whitespace rules at block edges."""

    def __init__(self) -> None:
        self.deltas: list[Delta] = []
        self.content_started = False
        self._held_space = ""  # trailing whitespace: dropped if a block follows
        self._skip_space = False  # just after a block edge: drop leading whitespace

    def text(self, kind: str, text: str) -> None:
        if self._skip_space:
            text = text.lstrip(_SPACE)
            if not text:
                return
            self._skip_space = False
        body = text.rstrip(_SPACE)
        if not body:
            self._held_space += text
            return
        self._add(kind, self._held_space + body)
        self._held_space = text[len(body) :]
        if kind == "content":
            self.content_started = True

    def tool_call(self, call: dict) -> None:
        self.deltas.append(Delta("tool_call", tool_call=call))

    def edge(self) -> None:
        """A block starts or ends here: the whitespace on both sides goes."""
        self._held_space = ""
        self._skip_space = True

    def end(self, kind: str) -> None:
        if kind == "content" and self._held_space:
            self._add(kind, self._held_space)
        self._held_space = ""

    def take(self) -> list[Delta]:
        deltas, self.deltas = self.deltas, []
        return deltas

    def _add(self, kind: str, text: str) -> None:
        if self.deltas and self.deltas[-1].kind == kind:
            self.deltas[-1] = Delta(kind, self.deltas[-1].text + text)
        else:
            self.deltas.append(Delta(kind, text))


class StreamParser:
    """Incremental parser: ``push`` pieces of the reply as they are generated, then
    ``finish``; each returns the deltas that became certain."""

    def __init__(self, reasoning: bool = True, tool_format: str | None = None, starts_in_reasoning: bool = False):
        if tool_format == HARMONY:
            raise InvalidOptionError("harmony replies are read by HarmonyParser: use make_parser()")
        if tool_format is not None and tool_format not in _TOOL_OPENERS:
            raise InvalidOptionError(f"unknown tool format {tool_format!r}; expected one of {TOOL_FORMATS}")
        self._format = tool_format
        self._buffer = ""
        self._out = _Emitter()
        self._finished = False
        self._closers: tuple[str, ...] | None = None  # set while inside reasoning
        self._collector: HermesCollector | JsonCallCollector | MistralCollector | None = None
        self._after_call = False
        openers: list[str] = []
        if reasoning:
            openers += [opener for opener, _ in REASONING_MARKERS] + list(_DROPPED_MARKERS)
        if tool_format is not None:
            openers += _TOOL_OPENERS[tool_format]
        self._openers = tuple(openers)
        if reasoning and starts_in_reasoning:
            self._closers = tuple(closer for _, closer in REASONING_MARKERS)
            self._out.edge()

    @property
    def in_reasoning(self) -> bool:
        """Whether the reply is inside a reasoning block (a constraint on the answer's
        form, such as a JSON schema, should wait until this turns False)."""
        return self._closers is not None

    def push(self, text: str) -> list[Delta]:
        if self._finished:
            raise InvalidOptionError("push() after finish()")
        if not isinstance(text, str):
            raise InvalidOptionError(f"push() takes text, not {type(text).__name__}")
        self._buffer += text
        self._advance(final=False)
        return self._out.take()

    def finish(self) -> list[Delta]:
        if self._finished:
            return []
        self._advance(final=True)
        self._out.end("reasoning" if self._closers is not None else "content")
        self._finished = True
        return self._out.take()

    # -- the state machine ---------------------------------------------------------

    def _advance(self, final: bool) -> None:
        while True:
            if self._collector is not None:
                progressed = self._step_tool(final)
            elif self._closers is not None:
                progressed = self._step_reasoning(final)
            else:
                progressed = self._step_content(final)
            if not progressed:
                return

    def _step_content(self, final: bool) -> bool:
        if self._format == "llama3" and not self._out.content_started:
            started = self._start_bare_json(final)
            if started is not None:
                return started
        found = earliest_marker(self._buffer, self._openers)
        if found is None:
            self._emit_settled("content", self._openers, final)
            return False
        index, marker = found
        self._out.text("content", self._buffer[:index])
        self._buffer = self._buffer[index + len(marker) :]
        self._open(marker)
        return True

    def _start_bare_json(self, final: bool) -> bool | None:
        """Llama 3 calls by replying with bare JSON: a ``{`` before any content opens a
        call. Returns True when one opens, False to wait for more text, None otherwise."""
        skipped = _SPACE + ";" if self._after_call else _SPACE
        lead = len(self._buffer) - len(self._buffer.lstrip(skipped))
        if lead == len(self._buffer):
            return None if final else False
        if self._buffer[lead] != "{":
            return None
        self._buffer = self._buffer[lead:]
        self._collector = JsonCallCollector("")
        return True

    def _open(self, marker: str) -> None:
        closer = _CLOSER_OF.get(marker)
        if closer is not None:
            self._out.edge()
            self._closers = (closer,)
        elif marker in _DROPPED_MARKERS:
            self._out.edge()
        else:
            self._collector = collector_for(marker)

    def _step_reasoning(self, final: bool) -> bool:
        assert self._closers is not None
        found = earliest_marker(self._buffer, self._closers)
        if found is None:
            self._emit_settled("reasoning", self._closers, final)
            return False
        index, marker = found
        self._out.text("reasoning", self._buffer[:index])
        self._buffer = self._buffer[index + len(marker) :]
        self._out.edge()
        self._closers = None
        return True

    def _step_tool(self, final: bool) -> bool:
        assert self._collector is not None
        result = self._collector.examine(self._buffer, final)
        if result is None:
            return False
        opener = self._collector.opener
        block, self._buffer = self._buffer[: result.end], self._buffer[result.end :]
        self._collector = None
        if result.calls:
            self._out.edge()
            for call in result.calls:
                self._out.tool_call(call)
            self._after_call = True
        else:  # not a call after all: the text, markers included, is content
            self._out.text("content", opener + block)
            self._out.content_started = True
        return True

    def _emit_settled(self, kind: str, markers: tuple[str, ...], final: bool) -> None:
        """Emit the buffer except a tail that may still grow into one of `markers`."""
        keep = 0 if final else partial_marker_length(self._buffer, markers)
        cut = len(self._buffer) - keep
        self._out.text(kind, self._buffer[:cut])
        self._buffer = self._buffer[cut:]


__all__ = [
    "REASONING_MARKERS",
    "TOOL_FORMATS",
    "Delta",
    "ParsedOutput",
    "StreamParser",
    "collect",
    "detect_tool_format",
    "make_parser",
    "parse_output",
    "prompt_opens_reasoning",
    "reply_format",
]
