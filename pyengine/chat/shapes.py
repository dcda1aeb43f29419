"""The JSON shapes replies take: Ollama's (``/api/chat``, ``/api/generate``) and
OpenAI's (``chat.completion``, ``chat.completion.chunk``, ``text_completion``).

Each shaper turns the events of one :class:`~pyengine.session.ChatStream` into
the dicts its API sends: ``piece``/``chunk`` for a streamed step (None when the step
shows nothing), and the closing object(s) from the ChatResult.
"""

from __future__ import annotations

import copy
import json
import secrets
import time
from datetime import datetime, timezone
from typing import Any, Callable

TokenBytes = Callable[[int], bytes]
_NS = 1_000_000_000


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now_rfc3339() -> str:
    """The current UTC time as Ollama writes it (RFC 3339, ``Z``)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _token_text(token_bytes: TokenBytes, token: int) -> str:
    return token_bytes(token).decode("utf-8", "replace")


# --------------------------------------------------------------------------------------
# Ollama
# --------------------------------------------------------------------------------------


def ollama_tool_calls(calls: list[dict]) -> list[dict]:
    """OpenAI-shaped calls as Ollama sends them (arguments an object, not a string)."""
    out = []
    for index, call in enumerate(calls):
        function = call["function"]
        try:
            arguments = json.loads(function["arguments"])
        except (ValueError, TypeError):
            arguments = {}
        out.append({"id": call.get("id"), "function": {"index": index, "name": function["name"],
                                                       "arguments": arguments}})
    return out


class OllamaShaper:
    """Ollama's reply objects for ``kind`` "chat" (a ``message``) or "generate" (``response``)."""

    def __init__(self, model: str, kind: str = "chat", *, token_bytes: TokenBytes | None = None,
                 load_seconds: float = 0.0, with_context: bool = False) -> None:
        self.model = model
        self.kind = kind
        self.token_bytes = token_bytes
        self.load_seconds = load_seconds
        self.with_context = with_context

    def piece(self, piece: Any) -> dict | None:
        content, thinking, calls = piece.text("content"), piece.text("reasoning"), piece.tool_calls
        if not (content or thinking or calls or piece.logprobs):
            return None
        out = self._body(content, thinking, calls)
        if piece.logprobs:
            out["logprobs"] = self._logprobs(piece.logprobs)
        return {**out, "done": False}

    def final(self, result: Any, streamed: bool) -> dict:
        if streamed:
            out = self._body("", None, [])
        else:
            out = self._body(result.content, result.reasoning, result.tool_calls)
            if result.logprobs:
                out["logprobs"] = self._logprobs(result.logprobs)
        out.update(done=True, done_reason=result.finish_reason if result.finish_reason != "tool_calls" else "stop")
        if self.with_context:
            out["context"] = list(result.prompt_ids) + list(result.tokens)
        load_ns = int(self.load_seconds * _NS)
        out.update(
            total_duration=int(result.total_seconds * _NS) + load_ns,
            load_duration=load_ns,
            prompt_eval_count=result.prompt_tokens,
            prompt_eval_duration=int(result.prompt_seconds * _NS),
            eval_count=result.completion_tokens,
            eval_duration=int(result.generation_seconds * _NS),
        )
        out.update(speculation_counts(result))
        return out

    def _body(self, content: str, thinking: str | None, calls: list[dict]) -> dict:
        out: dict[str, Any] = {"model": self.model, "created_at": now_rfc3339()}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = ollama_tool_calls(calls)
            out["message"] = message
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        return out

    def _logprobs(self, items) -> list[dict]:
        if self.token_bytes is None:
            return []
        text = self.token_bytes
        return [{"token": _token_text(text, item.token), "logprob": item.logprob,
                 "top_logprobs": [{"token": _token_text(text, t), "logprob": lp} for t, lp in item.top]}
                for item in items]


# --------------------------------------------------------------------------------------
# OpenAI
# --------------------------------------------------------------------------------------


def openai_usage(result: Any) -> dict:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens}


def speculation_counts(result: Any) -> dict:
    """A speculative request's drafting, for Ollama's final chunk: the draft tokens the
    model verified, how many it kept, and their ratio (nothing when it did not speculate)."""
    if not getattr(result, "speculative", None):
        return {}
    drafted, accepted = result.draft_tokens, result.draft_accepted
    return {"speculative": result.speculative, "draft_count": drafted, "draft_accepted_count": accepted,
            "draft_acceptance": accepted / drafted if drafted else 0.0}


def openai_timings(result: Any) -> dict:
    """llama-server's `timings` object (with its draft counts) for a speculative request;
    nothing for the others, whose replies stay as OpenAI's."""
    if not getattr(result, "speculative", None):
        return {}
    prompt_ms, predicted_ms = result.prompt_seconds * 1e3, result.generation_seconds * 1e3
    n = result.completion_tokens
    return {"timings": {"prompt_n": result.prompt_tokens, "prompt_ms": prompt_ms, "predicted_n": n,
                        "predicted_ms": predicted_ms,
                        "predicted_per_second": n / result.generation_seconds if result.generation_seconds else 0.0,
                        "draft_n": result.draft_tokens, "draft_n_accepted": result.draft_accepted}}


def _finish_reason(result: Any) -> str:
    return result.finish_reason if result.finish_reason in ("stop", "length", "tool_calls") else "stop"


class OpenAIChatShaper:
    """``chat.completion`` and ``chat.completion.chunk`` objects of one reply."""

    def __init__(self, model: str, *, token_bytes: TokenBytes | None = None, completion_id: str | None = None,
                 created: int | None = None) -> None:
        self.head = {"id": completion_id or new_id("chatcmpl"), "created": created or int(time.time()),
                     "model": model, "system_fingerprint": "pyengine"}
        self.token_bytes = token_bytes
        self.index = 0          # the choice's index (n > 1: see for_choice)
        self._n_calls = 0

    def for_choice(self, index: int) -> "OpenAIChatShaper":
        """A shaper of choice `index` of the same reply (same id and time)."""
        twin = copy.copy(self)
        twin.index, twin._n_calls = index, 0
        return twin

    def response(self, result: Any) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": result.content}
        if result.reasoning:
            message["reasoning_content"] = result.reasoning
        if result.tool_calls:
            message["tool_calls"] = [dict(call) for call in result.tool_calls]
        if result.tool_calls or getattr(result, "forced_call", False):
            message["content"] = result.content or None   # a forced call cut off: null, as OpenAI's
        choice = {"index": self.index, "message": message, "logprobs": self._logprobs(result.logprobs),
                  "finish_reason": _finish_reason(result)}
        return {**self.head, "object": "chat.completion", "choices": [choice], "usage": openai_usage(result),
                **openai_timings(result)}

    def first_chunk(self) -> dict:
        return self._chunk({"role": "assistant", "content": ""}, None)

    def chunk(self, piece: Any) -> dict | None:
        delta: dict[str, Any] = {}
        content, reasoning = piece.text("content"), piece.text("reasoning")
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        calls = piece.tool_calls
        if calls:
            delta["tool_calls"] = [self._call_delta(call) for call in calls]
        if not delta and not piece.logprobs:
            return None
        return self._chunk(delta, None, self._logprobs(piece.logprobs))

    def final_chunks(self, result: Any, include_usage: bool) -> list[dict]:
        chunks = [{**self._chunk({}, _finish_reason(result)), **openai_timings(result)}]
        if include_usage:
            chunks.append(self.usage_chunk(openai_usage(result)))
        return chunks

    def usage_chunk(self, usage: dict) -> dict:
        return {**self.head, "object": "chat.completion.chunk", "choices": [], "usage": usage}

    def _call_delta(self, call: dict) -> dict:
        index, self._n_calls = self._n_calls, self._n_calls + 1
        return {"index": index, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}

    def _chunk(self, delta: dict, finish_reason: str | None, logprobs: dict | None = None) -> dict:
        choice = {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return {**self.head, "object": "chat.completion.chunk", "choices": [choice]}

    def _logprobs(self, items) -> dict | None:
        if not items or self.token_bytes is None:
            return None
        return {"content": [self._logprob_entry(item) for item in items], "refusal": None}

    def _logprob_entry(self, item) -> dict:
        raw = self.token_bytes(item.token)
        entry = {"token": raw.decode("utf-8", "replace"), "logprob": item.logprob, "bytes": list(raw)}
        entry["top_logprobs"] = [
            {"token": self.token_bytes(t).decode("utf-8", "replace"), "logprob": lp, "bytes": list(self.token_bytes(t))}
            for t, lp in item.top
        ]
        return entry


class OpenAICompletionShaper:
    """``text_completion`` objects (the legacy ``/v1/completions``)."""

    def __init__(self, model: str, *, token_bytes: TokenBytes | None = None, echo_text: str = "") -> None:
        self.head = {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
                     "model": model, "system_fingerprint": "pyengine"}
        self.token_bytes = token_bytes
        self.echo_text = echo_text
        self.index = 0          # the choice's index (n > 1: see for_choice)
        self._offset = len(echo_text)

    def for_choice(self, index: int) -> "OpenAICompletionShaper":
        """A shaper of choice `index` of the same reply (same id and time)."""
        twin = copy.copy(self)
        twin.index, twin._offset = index, len(self.echo_text)
        return twin

    def response(self, result: Any) -> dict:
        self._offset = len(self.echo_text)
        choice = {"text": self.echo_text + result.content, "index": self.index,
                  "logprobs": self._logprobs(result.logprobs), "finish_reason": _finish_reason(result)}
        return {**self.head, "choices": [choice], "usage": openai_usage(result), **openai_timings(result)}

    def first_chunk(self) -> dict | None:
        if not self.echo_text:
            return None
        return {**self.head, "choices": [{"text": self.echo_text, "index": self.index, "logprobs": None,
                                          "finish_reason": None}]}

    def chunk(self, piece: Any) -> dict | None:
        text = piece.text("content")
        if not text and not piece.logprobs:
            return None
        choice = {"text": text, "index": self.index, "logprobs": self._logprobs(piece.logprobs),
                  "finish_reason": None}
        return {**self.head, "choices": [choice]}

    def final_chunks(self, result: Any, include_usage: bool) -> list[dict]:
        chunk = {**self.head, "choices": [{"text": "", "index": self.index, "logprobs": None,
                                           "finish_reason": _finish_reason(result)}], **openai_timings(result)}
        if include_usage:
            return [chunk, self.usage_chunk(openai_usage(result))]
        return [chunk]

    def usage_chunk(self, usage: dict) -> dict:
        return {**self.head, "choices": [], "usage": usage}

    def _logprobs(self, items) -> dict | None:
        if not items or self.token_bytes is None:
            return None
        tokens = [_token_text(self.token_bytes, item.token) for item in items]
        offsets = []
        for token in tokens:
            offsets.append(self._offset)
            self._offset += len(token)
        return {"tokens": tokens, "token_logprobs": [item.logprob for item in items],
                "top_logprobs": [{_token_text(self.token_bytes, t): lp for t, lp in item.top} for item in items],
                "text_offset": offsets}


__all__ = ["OllamaShaper", "OpenAIChatShaper", "OpenAICompletionShaper", "new_id", "now_rfc3339",
           "ollama_tool_calls", "openai_usage"]
