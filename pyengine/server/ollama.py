"""Ollama's API: /api/generate, /api/chat, /api/tags, /api/show, /api/ps, /api/pull,
/api/delete, /api/version. Streams are NDJSON (one object a line); errors are
``{"error": "message"}``."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pyengine import __version__, store
from pyengine.session import ChatResult
from pyengine.chat.shapes import OllamaShaper, now_rfc3339
from pyengine.errors import ModelNotFoundError, StoreError
from pyengine.options import OLLAMA_REQUEST_OPTIONS
from pyengine.sample.options import MAX_TOP_LOGPROBS, OPTION_NAMES
from pyengine.server import info, profiles
from pyengine.server.common import read_fields, start_reply, state_of
from pyengine.server.errors import HTTPError
from pyengine.server.fields import Fields
from pyengine.server.models import projector_for
from pyengine.server.registry import KEEP, parse_keep_alive
from pyengine.server.streaming import (NDJSON, GenerationResponse, collect_started, ndjson, stream_error_message,
                                      streamed_reply)
from pyengine.summary import model_summary

router = APIRouter()

# Options about loading or hardware: accepted (clients send them) and ignored here.
IGNORED_OPTIONS = frozenset({"numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
                             "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread",
                             "penalize_newline", "tfs_z"})
# The top-level fields Ollama defines (api/types.go), plus `grammar`: GBNF text, as llama-server takes it.
COMMON_FIELDS = frozenset({"model", "stream", "format", "keep_alive", "options", "think", "truncate", "shift",
                           "logprobs", "top_logprobs", "_debug_render_only", "grammar"})
GENERATE_FIELDS = COMMON_FIELDS | {"prompt", "suffix", "system", "template", "context", "raw", "images"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "tools"}
# The Ollama release whose API the routes follow: thinking levels, tools, structured outputs,
# logprobs (new in 0.12.11).
OLLAMA_API_VERSION = "0.12.11"
# What /api/* requests get where they and a created model set nothing: none here, as
# LLM.submit layers Ollama's defaults (surface "ollama") under the file's general.sampling.*
DEFAULTS: dict = {}
MAX_CONTEXT_IDS = 1 << 20


# --------------------------------------------------------------------------------------
# Reading requests
# --------------------------------------------------------------------------------------


def read_options(fields: Fields) -> dict:
    """The `options` object, checked by name and type (values are range-checked by the sampler)."""
    options = fields.nested("options")
    out: dict[str, Any] = {}
    for name in options.data:
        if name in IGNORED_OPTIONS:
            continue
        if name not in OPTION_NAMES and name not in OLLAMA_REQUEST_OPTIONS:
            raise HTTPError(400, f"unknown option {name!r} in 'options'", param=f"options.{name}")
    for name, value in options.data.items():
        if name in IGNORED_OPTIONS or value is None:
            continue
        if name == "stop":
            out["stop"] = options.stop("stop")
        elif name == "num_predict":
            out[name] = options.integer(name, low=-2, high=1 << 31)
        elif name in ("num_ctx",):
            out[name] = options.integer(name, low=1, high=1 << 31)
        elif name == "num_keep":
            out[name] = options.integer(name, low=-1, high=1 << 31)
        elif name == "shift":
            out[name] = options.boolean(name)
        else:
            out[name] = value
    return out  # what is left out: a created model's parameters (profiles.with_defaults), then Ollama's defaults


def read_format(fields: Fields) -> Any:
    value = fields.data.get("format")
    if value in (None, ""):
        return None
    if value == "json" or isinstance(value, dict):
        return value
    raise HTTPError(400, "'format' must be \"json\" or a JSON schema object", param="format")


def read_think(fields: Fields) -> bool | str | None:
    value = fields.data.get("think")
    if value is None or isinstance(value, bool) or value in ("low", "medium", "high"):
        return value
    raise HTTPError(400, "'think' must be true, false, \"low\", \"medium\" or \"high\"", param="think")


def read_common(fields: Fields) -> dict:
    """Fields /api/generate and /api/chat share."""
    options = read_options(fields)
    grammar = fields.string("grammar")
    if grammar:
        if fields.data.get("format") not in (None, ""):
            raise HTTPError(400, "give either 'grammar' or 'format', not both", param="grammar")
        options["grammar"] = grammar
    if fields.has("shift"):
        options["shift"] = fields.boolean("shift")
    fields.boolean("truncate")  # prompts longer than the context are refused either way
    fields.boolean("_debug_render_only")
    if fields.boolean("logprobs", False):
        options["logprobs"] = True
        options["top_logprobs"] = fields.integer("top_logprobs", 0, low=0, high=MAX_TOP_LOGPROBS)
    keep_alive = fields.data.get("keep_alive")
    return {
        "model": fields.string("model", required=True),
        "stream": fields.boolean("stream", True),
        "format": read_format(fields),
        "think": read_think(fields),
        "keep_alive": KEEP if keep_alive is None else parse_keep_alive(keep_alive),
        "options": options,
    }


# --------------------------------------------------------------------------------------
# /api/generate and /api/chat
# --------------------------------------------------------------------------------------


@router.post("/api/chat")
async def api_chat(request: Request) -> Response:
    fields = await read_fields(request)
    fields.reject_unknown(CHAT_FIELDS)
    common = read_common(fields)
    messages = fields.array("messages", [])
    tools = fields.array("tools")
    if not messages:
        return await _load_only(request, common, kind="chat")
    profile = profiles.profile_of(state_of(request).registry, common["model"])
    profiles.with_defaults(common["options"], profile)
    messages = profiles.conversation(profile, messages)

    def start(adapter):
        return adapter.start_chat(messages, tools=tools, format=common["format"], think=common["think"],
                                  options=common["options"])

    return await _reply(request, common, start, kind="chat")


@router.post("/api/generate")
async def api_generate(request: Request) -> Response:
    fields = await read_fields(request)
    fields.reject_unknown(GENERATE_FIELDS)
    common = read_common(fields)
    prompt = fields.string("prompt", "")
    system = fields.string("system")
    raw = fields.boolean("raw", False)
    suffix = fields.string("suffix")  # fill-in-the-middle: the text after the gap
    if fields.string("template"):
        raise HTTPError(400, "'template' is not supported by this server", param="template")
    images = fields.array("images", [])   # base64, each checked when the prompt is built
    context = _read_context(fields)
    if not prompt and not context and not suffix:
        return await _load_only(request, common, kind="generate")
    profile = profiles.profile_of(state_of(request).registry, common["model"])
    profiles.with_defaults(common["options"], profile)
    history = profile.messages if profile is not None else ()
    if system is None and profile is not None and profile.system:
        system = profile.system

    def start(adapter):
        return adapter.start_generate(prompt, system=system, raw=raw, context=context, format=common["format"],
                                      think=common["think"], suffix=suffix, history=history, images=images,
                                      options=common["options"])

    return await _reply(request, common, start, kind="generate")


def _read_context(fields: Fields) -> list[int] | None:
    context = fields.array("context", max_items=MAX_CONTEXT_IDS)
    if context and any(isinstance(t, bool) or not isinstance(t, int) for t in context):
        raise HTTPError(400, "'context' must be an array of token ids", param="context")
    return context or None


async def _reply(request: Request, common: dict, start, kind: str) -> Response:
    state = state_of(request)
    started = await start_reply(state, common["model"], start, options=common["options"])
    shaper = OllamaShaper(common["model"], kind=kind, token_bytes=started.lease.adapter.token_bytes,
                          load_seconds=started.lease.load_seconds, with_context=(kind == "generate"))
    keep_alive = common["keep_alive"]
    if common["stream"]:
        return streamed_reply(_stream(started.run, shaper), NDJSON, started, keep_alive)
    result = await collect_started(started, request.receive, keep_alive)
    if result is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    return JSONResponse(shaper.final(result, streamed=False))


async def _stream(run, shaper: OllamaShaper) -> AsyncIterator[bytes]:
    try:
        async for event in run:
            if isinstance(event, ChatResult):
                yield ndjson(shaper.final(event, streamed=True))
            else:
                chunk = shaper.piece(event)
                if chunk is not None:
                    yield ndjson(chunk)
    except Exception as exc:  # after the headers: report in the stream, as Ollama does
        yield ndjson({"error": stream_error_message(exc)})


async def _load_only(request: Request, common: dict, kind: str) -> Response:
    """An empty prompt loads the model (or, with keep_alive 0, unloads it)."""
    state = state_of(request)
    keep_alive = common["keep_alive"]
    lease = await state.registry.lease(common["model"], common["options"].get("num_ctx"))
    lease.release(keep_alive)
    reason = "load"
    if keep_alive == 0:
        await state.registry.sweep()
        reason = "unload"
    body: dict[str, Any] = {"model": common["model"], "created_at": now_rfc3339()}
    if kind == "chat":
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    body.update(done=True, done_reason=reason)
    return JSONResponse(body)


# --------------------------------------------------------------------------------------
# Models: tags, show, ps, pull, delete
# --------------------------------------------------------------------------------------


def _tagged(name: str) -> str:
    """A name as Ollama lists it: with a tag (``:latest`` unless it has one, as Hub names do)."""
    return name if ":" in name else f"{name}:latest"


@router.get("/api/tags")
async def api_tags(request: Request) -> Response:
    state = state_of(request)
    models = []
    for name, path in sorted(state.registry.available().items()):
        try:
            facts = info.model_facts(path)
        except (OSError, ValueError):
            continue  # a file that vanished or is not a GGUF: not listed
        models.append({"name": _tagged(name), "model": _tagged(name), "modified_at": info.rfc3339(facts.modified),
                       "size": facts.size, "digest": info.digest(name), "details": info.details(facts)})
    return JSONResponse({"models": models})


@router.post("/api/show")
async def api_show(request: Request) -> Response:
    state = state_of(request)
    fields = await read_fields(request)
    name = fields.string("model") or fields.string("name")
    if not name:
        raise HTTPError(400, "'model' is required", param="model")
    verbose = fields.boolean("verbose", False)
    _, path = state.registry.resolve(name)
    facts = info.model_facts(path)
    profile = profiles.profile_of(state.registry, name)
    created = profiles.show_fields(profile, facts.template) if profile is not None else {}
    if profile is not None and profile.template:
        facts = replace(facts, template=profile.template, renderer="")  # capabilities follow the template used
    details = info.details(facts)
    if profile is not None:
        details["parent_model"] = profile.base
    return JSONResponse({
        "license": facts.metadata.get("general.license", "") if isinstance(facts.metadata.get("general.license"), str)
        else "",
        "modelfile": f"FROM {path.name}\n",
        "parameters": "",
        "template": facts.template,
        **({"renderer": facts.renderer} if facts.renderer else {}),
        **created,
        "details": details,
        "model_info": info.model_info(facts, verbose),
        "capabilities": info.capabilities(facts, has_projector=projector_for(path, state.config) is not None),
        "modified_at": info.rfc3339(facts.modified),
        "summary": dict(model_summary(path)),
    })


@router.get("/api/ps")
async def api_ps(request: Request) -> Response:
    state = state_of(request)
    models = []
    for entry in state.registry.loaded():
        facts = info.model_facts(entry.path)
        expires = entry.expires_wall()
        models.append({
            "name": _tagged(entry.name), "model": _tagged(entry.name), "size": facts.size,
            "digest": info.digest(entry.name), "details": info.details(facts),
            "expires_at": info.rfc3339(expires) if expires is not None else "9999-12-31T23:59:59Z",
            "size_vram": 0, "context_length": entry.adapter.n_ctx, "active_requests": entry.active,
        })
    return JSONResponse({"models": models})


@router.delete("/api/delete")
async def api_delete(request: Request) -> Response:
    state = state_of(request)
    fields = await read_fields(request)
    name = fields.string("model") or fields.string("name")
    if not name:
        raise HTTPError(400, "'model' is required", param="model")
    canonical, _ = state.registry.resolve(name)
    if canonical in state.registry.served:
        raise HTTPError(400, f"model {name!r} was given at start-up as a file; it is not deleted from here")
    if state.registry.get_loaded(canonical) is not None and not await state.registry.unload(canonical):
        raise HTTPError(409, f"model {name!r} is in use; try again when its requests have finished")
    if not store.remove(canonical):
        raise HTTPError(404, f"model {name!r} not found")
    return Response(status_code=200)


@router.post("/api/pull")
async def api_pull(request: Request) -> Response:
    fields = await read_fields(request)
    name = fields.string("model") or fields.string("name")
    if not name:
        raise HTTPError(400, "'model' is required", param="model")
    stream = fields.boolean("stream", True)
    try:
        canonical = store.canonical_name(name)
    except ModelNotFoundError as exc:
        raise HTTPError(400, str(exc), param="model") from None
    if not store.pullable(canonical) and store.find_local(canonical) is None:
        raise HTTPError(404, f"model {name!r} is not in the catalog; known: {', '.join(sorted(store.catalog()))}, "
                             "or hf.co/OWNER/REPO:TAG from the Hugging Face Hub")
    pull = _Pull(canonical)
    if stream:
        return GenerationResponse(pull.stream(), NDJSON, on_close=pull.cancel)
    try:
        await pull.run()
    finally:
        pull.cancel()
    return JSONResponse({"status": "success"})


class _Pull:
    """A store pull in a worker thread, its progress queued for the event loop."""

    MIN_INTERVAL_S = 0.2

    def __init__(self, name: str) -> None:
        self.name = name
        self._cancelled = False
        self._last_sent = 0.0

    def cancel(self) -> None:
        self._cancelled = True

    async def run(self, on_progress=None) -> None:
        loop = asyncio.get_running_loop()

        def callback(status: str, completed: int, total: int) -> None:
            if self._cancelled:
                raise StoreError("pull cancelled")
            now = time.monotonic()
            if on_progress is not None and (now - self._last_sent >= self.MIN_INTERVAL_S or completed >= total):
                self._last_sent = now
                loop.call_soon_threadsafe(on_progress, status, completed, total)

        await asyncio.to_thread(store.pull, self.name, False, callback)

    async def stream(self) -> AsyncIterator[bytes]:
        queue: asyncio.Queue = asyncio.Queue()
        yield ndjson({"status": "pulling manifest"})
        task = asyncio.ensure_future(self.run(lambda *item: queue.put_nowait(item)))
        try:
            while not task.done() or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                status, completed, total = getter.result()
                if status == "success":
                    continue
                line: dict[str, Any] = {"status": status}
                if total:
                    line.update(digest=f"sha256:{info.digest(self.name)}", total=total, completed=completed)
                yield ndjson(line)
            task.result()
            yield ndjson({"status": "success"})
        except Exception as exc:
            yield ndjson({"error": stream_error_message(exc)})
        finally:
            self.cancel()


# --------------------------------------------------------------------------------------
# Misc
# --------------------------------------------------------------------------------------


@router.get("/api/version")
async def api_version() -> Response:
    """The Ollama release whose API this server follows (clients gate features on it), and pyengine's own."""
    return JSONResponse({"version": OLLAMA_API_VERSION, "pyengine_version": __version__})

# `GET /` (the "is running" probe, and the chat page for browsers) is in page.py.

