"""OpenAI's API: /v1/chat/completions, /v1/completions, /v1/models (/v1/embeddings is in
embeddings.py). Streams are
server-sent events ending with ``data: [DONE]``; errors are ``{"error": {"message",
"type", "param", "code"}}``. Unknown request fields are refused, as OpenAI does;
llama.cpp's and Ollama's extra sampling fields (``top_k``, ``min_p``, ``num_ctx``,
``repeat_penalty``, ...) are accepted."""

from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from pyengine.session import ChatResult, response_format_to_format
from pyengine.chat.shapes import OpenAIChatShaper, OpenAICompletionShaper
from pyengine.chat.tool_choice import read_tool_choice
from pyengine.errors import InvalidOptionError
from pyengine.sample.options import MAX_TOP_LOGPROBS
from pyengine.server import images, info, profiles
from pyengine.server.choices import MAX_CHOICES, Choices, merged_usage, start_choices
from pyengine.server.common import read_fields, start_reply, state_of
from pyengine.server.errors import HTTPError, error_body
from pyengine.server.fields import Fields
from pyengine.server.registry import KEEP, parse_keep_alive
from pyengine.server.streaming import SSE, collect_started, sse, stream_error_message, streamed_reply

router = APIRouter()

MAX_TOKENS = 1 << 31
# Extra sampling fields (llama.cpp's / Ollama's names) passed to the sampler as they are.
EXTRA_OPTIONS = ("top_k", "min_p", "typical_p", "repeat_penalty", "repeat_last_n", "num_ctx", "mirostat",
                 "mirostat_tau", "mirostat_eta", "top_n_sigma", "xtc_probability", "xtc_threshold",
                 "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
                 "num_keep", "speculative", "draft_max", "draft_min", "ngram_min", "ngram_max")
COMMON_FIELDS = frozenset({"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
                           "seed", "presence_penalty", "frequency_penalty", "logit_bias", "user", "keep_alive",
                           *EXTRA_OPTIONS})
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
                               "tools", "tool_choice", "parallel_tool_calls", "store", "metadata", "service_tier",
                               "reasoning_effort", "think"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "logprobs", "echo", "best_of", "suffix"}
REASONING_EFFORTS = {"none": False, "minimal": "low", "low": "low", "medium": "medium", "high": "high"}


# --------------------------------------------------------------------------------------
# Reading requests
# --------------------------------------------------------------------------------------


def read_sampling(fields: Fields, max_tokens_default: int | None, profile: Any = None) -> dict:
    """The options every endpoint shares, by Ollama's names; what the request leaves out comes
    from the created model's parameters (`profile`, see profiles.py) before the defaults."""
    options: dict[str, Any] = {
        "surface": "openai",   # what the request leaves out takes OpenAI's defaults (LLM.submit)
        "temperature": fields.number("temperature", None, low=0.0, high=2.0),
        "top_p": fields.number("top_p", None, low=0.0, high=1.0),
        "presence_penalty": fields.number("presence_penalty", None, low=-2.0, high=2.0),
        "frequency_penalty": fields.number("frequency_penalty", None, low=-2.0, high=2.0),
        "seed": fields.integer("seed", low=-(2**63), high=2**64 - 1),
        "stop": fields.stop("stop"),
        "num_predict": fields.integer("max_tokens", low=1, high=MAX_TOKENS),
    }
    bias = fields.obj("logit_bias")
    if bias:
        options["logit_bias"] = _logit_bias(bias)
    for name in EXTRA_OPTIONS:
        if fields.has(name):
            options[name] = fields.data[name]
    profiles.with_defaults(options, profile)
    if options.get("num_predict") is None:
        options["num_predict"] = max_tokens_default
    return options


def read_n(fields: Fields) -> int:
    """How many choices to generate (choices.py)."""
    return fields.integer("n", 1, low=1, high=MAX_CHOICES)


def _logit_bias(bias: dict) -> dict[int, float]:
    out = {}
    for key, value in bias.items():
        if not key.strip().isdigit():
            raise HTTPError(400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise HTTPError(400, f"logit_bias values must be numbers in [-100, 100], got {value!r}",
                            param="logit_bias")
        out[int(key)] = float(value)
    return out


def read_stream(fields: Fields) -> tuple[bool, bool]:
    stream = fields.boolean("stream", False)
    stream_options = fields.nested("stream_options")
    stream_options.reject_unknown({"include_usage", "include_obfuscation"})
    include_usage = bool(stream_options.boolean("include_usage", False))
    if include_usage and not stream:
        raise HTTPError(400, "stream_options is only allowed with stream=true", param="stream_options")
    return stream, include_usage


def read_keep_alive(fields: Fields) -> Any:
    value = fields.data.get("keep_alive")
    return KEEP if value is None else parse_keep_alive(value)


def read_think(fields: Fields) -> bool | str | None:
    effort = fields.string("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise HTTPError(400, f"reasoning_effort must be one of {sorted(REASONING_EFFORTS)}",
                            param="reasoning_effort")
        return REASONING_EFFORTS[effort]
    return fields.boolean("think")


def _options_error(exc: InvalidOptionError, param: str) -> HTTPError:
    return HTTPError(400, str(exc), param=param)


# --------------------------------------------------------------------------------------
# /v1/chat/completions
# --------------------------------------------------------------------------------------


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    fields = await read_fields(request)
    fields.reject_unknown(CHAT_FIELDS)
    model = fields.string("model", required=True)
    messages = fields.array("messages")
    if not messages:
        raise HTTPError(400, "'messages' must be a non-empty array", param="messages")
    stream, include_usage = read_stream(fields)
    config = state_of(request).config
    if config.remote_images:   # else an image URL is refused (400) when the prompt is built
        messages = await run_in_threadpool(images.remote_urls_fetched, messages, max_bytes=config.remote_image_bytes,
                                           timeout_s=config.remote_image_timeout_s)
    profile = profiles.profile_of(state_of(request).registry, model)
    messages = profiles.conversation(profile, messages)
    options = read_sampling(fields, None, profile)
    n = read_n(fields)
    if fields.has("max_completion_tokens"):
        options["num_predict"] = fields.integer("max_completion_tokens", low=1, high=MAX_TOKENS)
    if fields.boolean("logprobs", False):
        options["logprobs"] = True
        options["top_logprobs"] = fields.integer("top_logprobs", 0, low=0, high=MAX_TOP_LOGPROBS)
    elif fields.has("top_logprobs"):
        raise HTTPError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    fields.boolean("parallel_tool_calls")
    tools, tool_choice = fields.array("tools"), fields.data.get("tool_choice")
    try:
        read_tool_choice(tools, tool_choice)  # checked here: a bad choice is a 400 before any loading
    except InvalidOptionError as exc:
        raise _options_error(exc, "tool_choice") from None
    try:
        fmt = response_format_to_format(fields.data.get("response_format"))
    except InvalidOptionError as exc:
        raise _options_error(exc, "response_format") from None
    think = read_think(fields)
    keep_alive = read_keep_alive(fields)

    def start(adapter):
        return start_choices(lambda opts: adapter.start_chat(messages, tools=tools, tool_choice=tool_choice,
                                                             format=fmt, think=think, options=opts), options, n)

    started = await start_reply(state_of(request), model, start, options=options)
    shaper = OpenAIChatShaper(model, token_bytes=started.lease.adapter.token_bytes)
    return await _reply(request, started, shaper, stream=stream, include_usage=include_usage,
                        keep_alive=keep_alive)


async def _reply(request, started, shaper, *, stream: bool, include_usage: bool, keep_alive):
    """The answer to a started generation: an SSE stream, or the whole reply
    once collected (499 when the client went away first)."""
    if isinstance(started.run, Choices):
        return await _reply_choices(request, started, shaper, stream=stream, include_usage=include_usage,
                                    keep_alive=keep_alive)
    if stream:
        return streamed_reply(_sse_stream(started.run, shaper, include_usage), SSE, started, keep_alive)
    result = await collect_started(started, request.receive, keep_alive)
    if result is None:
        return Response(status_code=499)
    return JSONResponse(shaper.response(result))


async def _sse_stream(run, shaper, include_usage: bool) -> AsyncIterator[bytes]:
    try:
        head = shaper.first_chunk()
        if head is not None:
            yield sse(head)
        async for event in run:
            if isinstance(event, ChatResult):
                for chunk in shaper.final_chunks(event, include_usage):
                    yield sse(chunk)
            else:
                chunk = shaper.chunk(event)
                if chunk is not None:
                    yield sse(chunk)
    except Exception as exc:  # after the headers: report in the stream
        yield sse(error_body("/v1/", 400, stream_error_message(exc)))
    yield sse("[DONE]")


async def _reply_choices(request, started, shaper, *, stream: bool, include_usage: bool, keep_alive):
    """_reply for n > 1 choices: each shaped with its index, the usage counting the prompt once."""
    choices: Choices = started.run
    shapers = [shaper.for_choice(i) for i in range(len(choices.runs))]
    if stream:
        return streamed_reply(_sse_choices(choices, shapers, include_usage), SSE, started, keep_alive)
    results = await collect_started(started, request.receive, keep_alive,
                                    gather=lambda run, receive: run.collect(receive))
    if results is None:
        return Response(status_code=499)
    replies = [each.response(result) for each, result in zip(shapers, results)]
    return JSONResponse({**replies[0], "choices": [reply["choices"][0] for reply in replies],
                         "usage": merged_usage(results)})


async def _sse_choices(choices: Choices, shapers: list, include_usage: bool) -> AsyncIterator[bytes]:
    results = []
    try:
        for each in shapers:
            head = each.first_chunk()
            if head is not None:
                yield sse(head)
        async for index, event in choices.events():
            if isinstance(event, ChatResult):
                results.append(event)
                for chunk in shapers[index].final_chunks(event, False):
                    yield sse(chunk)
            else:
                chunk = shapers[index].chunk(event)
                if chunk is not None:
                    yield sse(chunk)
        if include_usage:
            yield sse(shapers[0].usage_chunk(merged_usage(results)))
    except Exception as exc:  # after the headers: report in the stream
        yield sse(error_body("/v1/", 400, stream_error_message(exc)))
    yield sse("[DONE]")


# --------------------------------------------------------------------------------------
# /v1/completions
# --------------------------------------------------------------------------------------


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    fields = await read_fields(request)
    fields.reject_unknown(COMPLETION_FIELDS)
    model = fields.string("model", required=True)
    prompt = _read_prompt(fields)
    stream, include_usage = read_stream(fields)
    profile = profiles.profile_of(state_of(request).registry, model)
    options = read_sampling(fields, 16, profile)  # OpenAI's default max_tokens for completions
    n = read_n(fields)
    if fields.integer("best_of", 1, low=1, high=128) != 1:
        raise HTTPError(400, "only best_of=1 is supported", param="best_of")
    suffix = fields.string("suffix")  # fill-in-the-middle between prompt and suffix, as Ollama's /v1 takes it
    if suffix and not isinstance(prompt, str):
        raise HTTPError(400, "a 'suffix' needs the prompt as text", param="suffix")
    n_logprobs = fields.integer("logprobs", low=0, high=5)
    if n_logprobs is not None:
        options["logprobs"] = True
        options["top_logprobs"] = n_logprobs
    echo = fields.boolean("echo", False)
    keep_alive = read_keep_alive(fields)

    def start(adapter):
        if suffix:
            return start_choices(lambda opts: adapter.start_infill(prompt, suffix, options=opts), options, n)
        return start_choices(lambda opts: adapter.start_completion(prompt, options=opts), options, n)

    started = await start_reply(state_of(request), model, start, options=options)
    adapter = started.lease.adapter
    echo_text = "" if not echo else (prompt if isinstance(prompt, str) else adapter.detokenize(prompt))
    shaper = OpenAICompletionShaper(model, token_bytes=adapter.token_bytes, echo_text=echo_text)
    return await _reply(request, started, shaper, stream=stream, include_usage=include_usage,
                        keep_alive=keep_alive)


def _read_prompt(fields: Fields) -> str | list[int]:
    prompt = fields.data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise HTTPError(400, "only one prompt per request is supported", param="prompt")
    raise HTTPError(400, "'prompt' must be a non-empty string or an array of token ids", param="prompt")


# --------------------------------------------------------------------------------------
# /v1/models
# --------------------------------------------------------------------------------------


def _model_object(name: str, path) -> dict:
    try:
        created = int(info.model_facts(path).modified)
    except (OSError, ValueError):
        created = 0
    return {"id": name, "object": "model", "created": created, "owned_by": "pyengine"}


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    available = state_of(request).registry.available()
    return JSONResponse({"object": "list", "data": [_model_object(n, p) for n, p in sorted(available.items())]})


@router.get("/v1/models/{model}")
async def get_model(request: Request, model: str) -> Response:
    name, path = state_of(request).registry.resolve(model)
    return JSONResponse(_model_object(name, path))
