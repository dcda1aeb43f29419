"""The responses ``/v1/responses`` keeps (``store``, OpenAI's default): the last ones, in
memory, bounded by count and by size, the oldest dropped first; gone when the server stops.

Each entry is the response object (``GET /v1/responses/{id}``) and the conversation that
led to it, its reply included, as chat messages: what a request naming it in
``previous_response_id`` continues from.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

MAX_RESPONSES = 256
MAX_BYTES = 64 << 20   # the JSON size of everything kept


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[dict, list[dict], int]] = OrderedDict()
        self._bytes = 0

    def put(self, response: dict, history: list[dict]) -> None:
        size = len(json.dumps([response, history], ensure_ascii=False))
        if size > self.max_bytes:
            return   # larger than the whole store: not kept
        self.delete(response["id"])
        self._entries[response["id"]] = (response, history, size)
        self._bytes += size
        while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped

    def get(self, response_id: str) -> tuple[dict, list[dict]] | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        self._entries.move_to_end(response_id)   # a conversation in use stays
        return entry[0], entry[1]

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry[2]
        return entry is not None

    def __len__(self) -> int:
        return len(self._entries)


def reply_message(result: Any) -> dict:
    """A finished reply as the assistant turn a later request renders."""
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        message["tool_calls"] = [dict(call) for call in result.tool_calls]
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    return message


__all__ = ["MAX_BYTES", "MAX_RESPONSES", "ResponseStore", "reply_message"]
