"""llama.cpp's ``POST /infill``: code completion between a prefix and a suffix, for editor
plugins (llama.vim, llama.vscode).

Request: ``input_prefix`` and ``input_suffix`` (required), ``input_extra`` (files of
context: ``[{"filename", "text"}]``), ``prompt`` (text after the prefix, special tokens
read), ``model`` (default: the first model the server was started with), ``n_predict``
(or ``max_tokens``; -1: until the end), ``stream``, and llama-server's sampling fields
with its defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no repetition
penalty). The FIM prompt is :mod:`pyengine.chat.fim`'s. Fields llama-server reads that
have no effect here are accepted and ignored (``cache_prompt`` - the prompt cache is
always on -, ``id_slot``, ``n_indent``, ``t_max_prompt_ms``, ``t_max_predict_ms``,
``response_fields``, ``timings_per_token``, ``n_keep``, ``n_discard``, ``min_keep``,
``post_sampling_probs``), and the ``infill`` sampler in ``samplers`` is dropped (the
chain has none); any other field is refused with 400 naming it.

Response, as llama-server's ``/completion``: ``content``, ``stop``, ``model``,
``tokens_predicted``, ``tokens_evaluated``, ``prompt``, ``has_new_line``,
``stop_type`` ("eos", "word", "limit" or "none"), ``stopping_word``, ``timings``, ...;
streamed, server-sent events of ``{"content", "stop": false, ...}`` and a last one with
``stop`` true and the totals.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pyengine.chat.fim import read_extra
from pyengine.session import ChatResult
from pyengine.errors import InvalidOptionError
from pyengine.server.common import read_fields, start_reply, state_of
from pyengine.server.errors import HTTPError
from pyengine.server.fields import Fields
from pyengine.server.registry import KEEP, parse_keep_alive
from pyengine.server.streaming import SSE, collect_started, sse, stream_error_message, streamed_reply

router = APIRouter()

# llama-server's defaults for these (common.h), applied when the request leaves them out
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
            "repeat_last_n": 64}
SAMPLING_FIELDS = frozenset({
    "temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
    "presence_penalty", "frequency_penalty", "seed", "mirostat", "mirostat_tau", "mirostat_eta",
    "top_n_sigma", "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "dry_sequence_breakers", "dynatemp_range", "dynatemp_exponent", "logit_bias",
    "samplers", "n_probs",
})
IGNORED_FIELDS = frozenset({"cache_prompt", "id_slot", "n_indent", "t_max_prompt_ms", "t_max_predict_ms",
                            "response_fields", "timings_per_token", "n_keep", "n_discard", "min_keep",
                            "post_sampling_probs"})
FIELDS = SAMPLING_FIELDS | IGNORED_FIELDS | {
    "model", "input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "max_tokens", "stream",
    "stop", "grammar", "json_schema", "return_tokens", "keep_alive",
}
MAX_TOKENS = 1 << 31
_STOP_TYPES = {"length": "limit", "cancelled": "none"}


@router.post("/infill")
async def infill(request: Request) -> Response:
    fields = await read_fields(request)
    fields.reject_unknown(FIELDS)
    state = state_of(request)
    model = fields.string("model") or state.registry.default_model
    if not model:
        raise HTTPError(400, "'model' is required: the server was started without a default model",
                        param="model")
    prefix, suffix = _required_text(fields, "input_prefix"), _required_text(fields, "input_suffix")
    prompt = fields.string("prompt", "")
    try:
        extra = read_extra(fields.data.get("input_extra"))
    except InvalidOptionError as exc:
        raise HTTPError(400, str(exc), param="input_extra") from None
    options = read_options(fields)
    stream = fields.boolean("stream", False)
    return_tokens = fields.boolean("return_tokens", False)
    keep_alive = fields.data.get("keep_alive")
    keep_alive = KEEP if keep_alive is None else parse_keep_alive(keep_alive)

    def start(adapter):
        return adapter.start_infill(prefix, suffix, extra=extra, prompt=prompt, options=options)

    started = await start_reply(state, model, start, options)
    adapter = started.lease.adapter
    shaper = _Shaper(model, adapter, options, return_tokens)
    if stream:
        return streamed_reply(_stream(started.run, shaper), SSE, started, keep_alive)
    result = await collect_started(started, request.receive, keep_alive)
    if result is None:
        return Response(status_code=499)  # the client is gone
    return JSONResponse(shaper.final(result, content=result.content))


def _required_text(fields: Fields, name: str) -> str:
    if not fields.has(name):
        raise HTTPError(400, f'"{name}" is required', param=name)
    return fields.string(name, "")


def read_options(fields: Fields) -> dict:
    """The generation options by Ollama's names (values are checked by the sampler)."""
    options: dict[str, Any] = {name: fields.data[name] for name in SAMPLING_FIELDS
                               if fields.data.get(name) is not None}
    for name, value in DEFAULTS.items():
        options.setdefault(name, value)
    samplers = options.get("samplers")
    if isinstance(samplers, list):  # llama.vim asks for llama.cpp's infill sampler: none here
        options["samplers"] = [name for name in samplers if name != "infill"]
    limit_name = "n_predict" if fields.has("n_predict") else "max_tokens"
    options["num_predict"] = fields.integer(limit_name, -1, low=-1, high=MAX_TOKENS)
    stop = fields.stop("stop")
    if stop:
        options["stop"] = stop
    grammar, schema = fields.string("grammar"), fields.obj("json_schema")
    if grammar and schema:
        raise HTTPError(400, 'Either "json_schema" or "grammar" can be specified, but not both', param="grammar")
    if grammar:
        options["grammar"] = grammar
    elif schema:
        options["format"] = schema
    return options


class _Shaper:
    """llama-server's /completion objects for one reply."""

    def __init__(self, model: str, adapter: Any, options: dict, return_tokens: bool) -> None:
        self.model = model
        self.adapter = adapter
        self.options = options
        self.return_tokens = return_tokens

    def piece(self, text: str) -> dict:
        return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": 0}

    def final(self, result: ChatResult, content: str) -> dict:
        stop_type = _STOP_TYPES.get(result.finish_reason, "word" if result.stop_string else "eos")
        prompt_ms, predicted_ms = result.prompt_seconds * 1e3, result.generation_seconds * 1e3
        n_prompt, n_predicted = result.prompt_tokens, result.completion_tokens
        return {
            "index": 0, "content": content, "tokens": list(result.tokens) if self.return_tokens else [],
            "id_slot": 0, "stop": True, "model": self.model,
            "tokens_predicted": n_predicted, "tokens_evaluated": n_prompt,
            "generation_settings": {"n_ctx": self.adapter.n_ctx, **self.options},
            "prompt": self.adapter.detokenize(result.prompt_ids), "has_new_line": "\n" in result.content,
            "truncated": False, "stop_type": stop_type, "stopping_word": result.stop_string or "",
            "tokens_cached": 0,
            "timings": {
                "prompt_n": n_prompt, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
                "prompt_per_second": n_prompt / result.prompt_seconds if result.prompt_seconds else 0.0,
                "predicted_n": n_predicted, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / n_predicted if n_predicted else 0.0,
                "predicted_per_second": n_predicted / result.generation_seconds if result.generation_seconds else 0.0,
            },
        }


async def _stream(run, shaper: _Shaper) -> AsyncIterator[bytes]:
    try:
        async for event in run:
            if isinstance(event, ChatResult):
                yield sse(shaper.final(event, content=""))
            else:
                text = event.text()
                if text:
                    yield sse(shaper.piece(text))
    except Exception as exc:  # after the headers: report in the stream, as llama-server does
        yield sse({"error": {"code": 400, "message": stream_error_message(exc), "type": "invalid_request_error"}})


__all__ = ["router"]
