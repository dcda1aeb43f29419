"""The shapes of OpenAI's Responses API (``/v1/responses``): the ``response`` object of a
whole reply, and the typed events of a streamed one.

A reply's ``output`` is a list of items: a ``reasoning`` item when the model thought
(its text as one ``reasoning_text`` part), a ``message`` with one ``output_text`` part,
and one ``function_call`` item per tool call. A reply that is only tool calls has no
message. A stream opens each item (``response.output_item.added``), sends its text as
deltas, closes it (``...done`` events, each with the whole text) and ends with
``response.completed`` (or ``response.incomplete`` when ``max_output_tokens`` cut it
off) carrying the whole response; every event has a ``sequence_number``. The SDK's
``response.output_text`` is computed by the client from the message's parts.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Callable

TokenBytes = Callable[[int], bytes]


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def responses_usage(result: Any) -> dict:
    return {"input_tokens": result.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": result.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": result.prompt_tokens + result.completion_tokens}


def _is_cut_off(result: Any) -> bool:
    return result.finish_reason == "length"


# --------------------------------------------------------------------------------------
# Output items
# --------------------------------------------------------------------------------------


def message_item(item_id: str, text: str, status: str, logprobs: list | None = None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def function_call_item(call: dict, status: str = "completed") -> dict:
    """An OpenAI-shaped parsed call (``{"id", "function": {"name", "arguments"}}``) as an item."""
    function = call["function"]
    return {"type": "function_call", "id": new_item_id("fc"), "call_id": call["id"], "name": function["name"],
            "arguments": function["arguments"], "status": status}


class ResponsesShaper:
    """The ``response`` object and stream events of one reply.

    `echo` holds the request's settings the response object repeats (``instructions``,
    ``tools``, ``tool_choice``, ``text``, ``temperature``, ...); `logprobs` asks for the
    tokens' log-probabilities on the output text.
    """

    def __init__(self, model: str, echo: dict, *, token_bytes: TokenBytes | None = None,
                 logprobs: bool = False) -> None:
        self.head = {"id": new_item_id("resp"), "object": "response", "created_at": int(time.time()),
                     "model": model}
        self.echo = echo
        self.token_bytes = token_bytes
        self.logprobs = logprobs and token_bytes is not None
        self._sequence = 0
        self._items: list[dict] = []        # the output items opened so far, in order
        self._open: dict | None = None      # the message or reasoning item being streamed
        self._pending_logprobs: list = []   # logprobs of tokens whose text has not been shown yet

    # ----- the whole reply ------------------------------------------------------------

    def response(self, result: Any) -> dict:
        status = "incomplete" if _is_cut_off(result) else "completed"
        output = []
        if result.reasoning:
            output.append(reasoning_item(new_item_id("rs"), result.reasoning, status))
        if result.content or not (result.tool_calls or result.forced_call):
            logprobs = self._logprobs(result.logprobs or []) if self.logprobs else None
            output.append(message_item(new_item_id("msg"), result.content, status, logprobs))
        output.extend(function_call_item(call) for call in result.tool_calls)
        return self._object(status, output, result)

    def _object(self, status: str, output: list[dict], result: Any | None) -> dict:
        body = {**self.head, "status": status, "error": None, "incomplete_details": None, **self.echo,
                "output": output, "usage": responses_usage(result) if result is not None else None}
        if result is not None:
            body["completed_at"] = int(time.time())
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        return body

    # ----- a stream -------------------------------------------------------------------

    def start_events(self) -> list[dict]:
        snapshot = self._object("in_progress", [], None)
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def piece_events(self, piece: Any) -> list[dict]:
        events: list[dict] = []
        if self.logprobs and piece.logprobs:
            self._pending_logprobs.extend(self._logprobs(piece.logprobs))
        for delta in piece.deltas:
            if delta.kind == "tool_call" and delta.tool_call:
                events += self._close_open("completed") + self._call_events(delta.tool_call)
            elif delta.kind == "reasoning" and delta.text:
                events += self._text_delta("reasoning", delta.text)
            elif delta.kind == "content" and delta.text:
                events += self._text_delta("message", delta.text)
        return events

    def final_events(self, result: Any) -> list[dict]:
        status = "incomplete" if _is_cut_off(result) else "completed"
        if not self._items and not result.forced_call:
            self._open_item("message")  # a reply with no text still has its (empty) message
        events = self._close_open(status)
        output = [item for item in self._items]
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return events + [self._event(kind, response=self._object(status, output, result))]

    def error_events(self, message: str, code: str | None = None) -> list[dict]:
        """What a stream that failed after its headers ends with: an ``error`` event and
        ``response.failed``."""
        failed = {**self._object("failed", list(self._items), None),
                  "error": {"code": "server_error", "message": message}}
        return [self._event("error", code=code, message=message, param=None),
                self._event("response.failed", response=failed)]

    def _event(self, kind: str, **fields: Any) -> dict:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _text_delta(self, kind: str, text: str) -> list[dict]:
        events: list[dict] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close_open("completed") + self._open_item(kind)
        item = self._open
        part = item["content"][0]
        part["text"] += text
        where = {"item_id": item["id"], "output_index": self._items.index(item), "content_index": 0}
        if kind == "reasoning":
            return events + [self._event("response.reasoning_text.delta", **where, delta=text)]
        logprobs, self._pending_logprobs = self._pending_logprobs, []
        if self.logprobs:
            part["logprobs"].extend(logprobs)
        return events + [self._event("response.output_text.delta", **where, delta=text, logprobs=logprobs)]

    def _open_item(self, kind: str) -> list[dict]:
        if kind == "reasoning":
            item = reasoning_item(new_item_id("rs"), "", "in_progress")
        else:
            item = message_item(new_item_id("msg"), "", "in_progress", [] if self.logprobs else None)
        self._items.append(item)
        self._open = item
        index = len(self._items) - 1
        added = self._event("response.output_item.added", output_index=index, item=_copy_item(item, empty=True))
        part = self._event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                           part=_empty_part(item))
        return [added, part]

    def _close_open(self, status: str) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = self._items.index(item)
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if item["type"] == "reasoning":
            done = self._event("response.reasoning_text.done", **where, text=part["text"])
        else:
            if self.logprobs and self._pending_logprobs:
                part["logprobs"].extend(self._pending_logprobs)
                self._pending_logprobs = []
            done = self._event("response.output_text.done", **where, text=part["text"],
                               logprobs=part.get("logprobs") or [])
        item["status"] = status
        return [done, self._event("response.content_part.done", **where, part=dict(part)),
                self._event("response.output_item.done", output_index=index, item=_copy_item(item))]

    def _call_events(self, call: dict) -> list[dict]:
        item = function_call_item(call)
        self._items.append(item)
        index = len(self._items) - 1
        where = {"item_id": item["id"], "output_index": index}
        return [self._event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"}),
                self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **where, arguments=item["arguments"],
                            name=item["name"]),
                self._event("response.output_item.done", output_index=index, item=dict(item))]

    # ----- log-probabilities ----------------------------------------------------------

    def _logprobs(self, items) -> list[dict]:
        return [{**self._token(item.token, item.logprob),
                 "top_logprobs": [self._token(token, logprob) for token, logprob in item.top]} for item in items]

    def _token(self, token: int, logprob: float) -> dict:
        raw = self.token_bytes(token)
        return {"token": raw.decode("utf-8", "replace"), "bytes": list(raw), "logprob": logprob}


def _empty_part(item: dict) -> dict:
    part = item["content"][0]
    return {**part, "text": "", **({"logprobs": []} if "logprobs" in part else {})}


def _copy_item(item: dict, empty: bool = False) -> dict:
    """A snapshot of `item` for an event (the item itself keeps growing); `empty`: as opened."""
    return {**item, "content": [] if empty else [dict(part) for part in item["content"]]}


__all__ = ["ResponsesShaper", "function_call_item", "message_item", "reasoning_item", "responses_usage"]
