"""The prefix keys a cluster router matches requests by, so that a request goes to the
replica whose prefix cache already holds the start of its prompt.

A request's prompt is cut into units (each message's role and text in blocks of
``BLOCK_CHARS``; a raw prompt in the same blocks) and each unit's key hashes it with the
key before it, the first with the model's name: two requests share their first k keys exactly when their first k
units are equal. A chat's second turn repeats its first turn's messages, so its keys start
with all of the first turn's. Only the first ``MAX_UNITS`` count (the rest barely changes
where the request should go), which bounds the work per request.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

BLOCK_CHARS = 128
MAX_UNITS = 64
_MESSAGE_EXTRAS = ("images", "tool_calls", "tool_call_id", "name", "type", "call_id", "output", "arguments")


def prefix_keys(body: bytes) -> list[int]:
    """The chained keys of a request body (JSON); none for a body that is not a JSON object."""
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        return []
    if not isinstance(payload, dict):
        return []
    keys: list[int] = []
    previous = b""
    for unit in _units(payload):
        digest = hashlib.blake2b(previous + unit.encode("utf-8", "replace"), digest_size=8).digest()
        keys.append(int.from_bytes(digest, "little"))
        previous = digest
        if len(keys) == MAX_UNITS + 1:
            break
    return keys[1:]  # the model's own key only seeds the chain: alone it is no shared prompt


def _units(payload: dict) -> Iterator[str]:
    yield f"model\x00{payload.get('model')}"
    for field in ("system", "instructions"):  # Ollama's generate, OpenAI's responses
        if isinstance(payload.get(field), str):
            yield from _blocks(f"system\x00{payload[field]}")
    for field in ("messages", "input"):
        items = payload.get(field)
        if isinstance(items, str):
            yield from _blocks(f"user\x00{items}")
        elif isinstance(items, list):
            for item in items:
                yield from _blocks(_message_text(item))
    if isinstance(payload.get("context"), list):  # Ollama's tokens of an earlier turn
        yield from _blocks("context\x00" + json.dumps(payload["context"]))
    if "prompt" in payload:
        prompt = payload["prompt"]
        yield from _blocks("prompt\x00" + (prompt if isinstance(prompt, str) else _canonical(prompt)))


def _message_text(item: Any) -> str:
    if not isinstance(item, dict):
        return _canonical(item)
    content = item.get("content")
    text = content if isinstance(content, str) else _canonical(content)
    extras = {key: item[key] for key in _MESSAGE_EXTRAS if key in item}
    return f"{item.get('role')}\x00{text}" + (f"\x00{_canonical(extras)}" if extras else "")


def _blocks(text: str) -> Iterator[str]:
    for start in range(0, max(len(text), 1), BLOCK_CHARS):
        yield text[start:start + BLOCK_CHARS]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


__all__ = ["BLOCK_CHARS", "MAX_UNITS", "prefix_keys"]
