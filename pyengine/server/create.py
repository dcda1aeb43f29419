"""Ollama's model-making routes: /api/create, /api/copy and /api/blobs/:digest.

A created model is a manifest in the store (store.CreatedModel): the GGUF it runs (a
model's file, or an uploaded blob) and the template, system prompt, parameters,
messages and license it adds. Everything is checked before the answer starts, so a bad
request is a plain 4xx; the stream that follows only reports what was done, ending
with ``{"status": "success"}`` as Ollama's does.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from pyengine import store
from pyengine.chat.messages import normalize_messages
from pyengine.chat.template import ChatTemplate
from pyengine.errors import InvalidOptionError, PyEngineError
from pyengine.sample.options import OPTION_NAMES, SamplingOptions
from pyengine.server.common import read_fields, state_of
from pyengine.server.errors import HTTPError
from pyengine.server.fields import Fields
from pyengine.server.ollama import read_options
from pyengine.server.streaming import NDJSON, ndjson

router = APIRouter()

# The fields of Ollama's CreateRequest (api/types.go); those marked unsupported are refused when set.
CREATE_FIELDS = frozenset({"model", "name", "from", "files", "adapters", "template", "license", "system",
                           "parameters", "messages", "stream", "quantize", "quantization", "renderer", "parser",
                           "requires", "info", "capabilities"})
UNSUPPORTED_FIELDS = ("quantize", "quantization", "renderer", "parser", "info", "capabilities")
MAX_MESSAGES = 256
MAX_TEXT_CHARS = 1 << 20         # a system prompt or one license text
WRITE_BATCH_BYTES = 4 << 20      # upload bytes gathered before one write (off the event loop)
_GO_TEMPLATE = re.compile(r"\{\{-?\s*(\.|range\b|if\s+\.|end\b)")


# --------------------------------------------------------------------------------------
# /api/create
# --------------------------------------------------------------------------------------


@router.post("/api/create")
async def api_create(request: Request) -> Response:
    state = state_of(request)
    fields = await read_fields(request)
    if fields.has("modelfile"):
        raise HTTPError(400, "'modelfile' is the old form of /api/create; send 'from' (or 'files'), 'system', "
                             "'template', 'parameters', 'messages' and 'license' as fields", param="modelfile")
    fields.reject_unknown(CREATE_FIELDS)
    for name in UNSUPPORTED_FIELDS:
        if fields.data.get(name) not in (None, "", [], {}):
            raise HTTPError(400, f"'{name}' is not supported by this server (GGUF models are used as they are)",
                            param=name)
    if fields.data.get("adapters"):
        raise HTTPError(400, "LoRA adapters are not supported", param="adapters")
    name = fields.string("model") or fields.string("name")
    if not name:
        raise HTTPError(400, "'model' is required: the name of the model to create", param="model")
    stream = fields.boolean("stream", True)
    try:
        canonical = store.created_name(name)
    except PyEngineError as exc:
        raise HTTPError(400, str(exc), param="model") from None
    if canonical in state.registry.served:
        raise HTTPError(400, f"cannot create {name!r}: a model of that name was given at start-up", param="model")

    statuses: list[str] = []
    base = await _read_base(state, fields, statuses)
    created = _read_settings(fields, replace(base, name=canonical))
    _check_template(created.template)
    if state.registry.get_loaded(canonical) is not None and not await state.registry.unload(canonical):
        raise HTTPError(409, f"model {name!r} is in use; try again when its requests have finished")
    statuses.append("writing manifest")
    await run_in_threadpool(store.save_created, created)
    statuses.append("success")
    if not stream:
        return JSONResponse({"status": "success"})

    async def lines():
        for status in statuses:
            yield ndjson({"status": status})

    return StreamingResponse(lines(), media_type=NDJSON)


async def _read_base(state, fields: Fields, statuses: list[str]) -> store.CreatedModel:
    """What the new model starts from: `from` (a model: a created one brings its settings
    along) or `files` (one uploaded GGUF blob)."""
    source = fields.string("from")
    files = fields.obj("files")
    if source and files:
        raise HTTPError(400, "give either 'from' or 'files', not both", param="files")
    if files:
        digest = _one_gguf_blob(files)
        statuses.append("parsing GGUF")
        path = store.blob_path(digest)
        await run_in_threadpool(_check_gguf, path, digest)
        statuses.append(f"using existing layer {digest}")
        return store.CreatedModel(name="", file=path, base=digest)
    if not source:
        raise HTTPError(400, "neither 'from' or 'files' was specified", param="from")
    canonical, path = state.registry.resolve(source)
    statuses.append(f"using model {canonical}")
    inherited = store.created_model(canonical)
    if inherited is not None and inherited.file == path:
        return replace(inherited, base=canonical)
    return store.CreatedModel(name="", file=path, base=canonical)


def _one_gguf_blob(files: dict) -> str:
    if len(files) != 1:
        raise HTTPError(400, f"'files' names {len(files)} files; give exactly one GGUF model file", param="files")
    (file_name, digest), = files.items()
    if (not isinstance(file_name, str) or not file_name or file_name in (".", "..") or file_name.startswith("/")
            or any(ch in file_name for ch in "\\:") or ".." in file_name.split("/")):
        raise HTTPError(400, f"file path must be relative: {file_name!r}", param="files")
    try:
        digest = store.blob_digest(digest)
    except InvalidOptionError as exc:
        raise HTTPError(400, f"invalid digest for {file_name}: {exc}", param="files") from None
    if not store.has_blob(digest):
        raise HTTPError(400, f"blob not found for {file_name} (digest {digest}); upload it first "
                             f"(POST /api/blobs/{digest})", param="files")
    return digest


def _check_gguf(path: Path, digest: str) -> None:
    """400 unless the blob is a GGUF model pyengine can read (not an adapter or a projector)."""
    from pyengine.gguf import GGUFFile

    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
        if magic != b"GGUF":
            raise HTTPError(400, f"blob {digest} is not in GGUF format", param="files")
        with GGUFFile(path) as gguf:
            kind = gguf.metadata.get("general.type")
            arch = gguf.metadata.get("general.architecture")
    except HTTPError:
        raise
    except (PyEngineError, OSError, ValueError) as exc:
        raise HTTPError(400, f"blob {digest} is not a valid GGUF file: {exc}", param="files") from None
    if kind == "adapter":
        raise HTTPError(400, f"blob {digest} is a LoRA adapter; LoRA adapters are not supported", param="files")
    if arch == "clip" or kind in ("projector", "mmproj"):
        raise HTTPError(400, f"blob {digest} is a vision projector, not a model", param="files")


def _read_settings(fields: Fields, base: store.CreatedModel) -> store.CreatedModel:
    """The base's settings with the request's on top: template, system, messages and license
    replace the base's; parameters are merged, the request's winning."""
    changes: dict[str, Any] = {}
    template = fields.string("template")
    if template is not None:
        changes["template"] = template
    system = fields.string("system")
    if system is not None:
        changes["system"] = _bounded_text("system", system)
    if fields.has("license"):
        changes["license"] = _read_license(fields.data["license"])
    if fields.has("parameters"):
        changes["parameters"] = {**base.parameters, **read_parameters(fields.obj("parameters"))}
    if fields.has("messages"):
        changes["messages"] = _read_messages(fields.array("messages", max_items=MAX_MESSAGES))
    return replace(base, **changes)


def read_parameters(parameters: dict) -> dict:
    """Parameters as requests' options are read (unknown names and bad values: 400), kept by
    the names they were given in."""
    try:
        options = read_options(Fields({"options": parameters}))
    except HTTPError as exc:
        raise HTTPError(400, exc.message.replace("'options'", "'parameters'"), param="parameters") from None
    sampling = {name: value for name, value in options.items() if name in OPTION_NAMES}
    try:
        SamplingOptions.from_dict(sampling)
    except InvalidOptionError as exc:
        raise HTTPError(400, f"invalid parameter: {exc}", param="parameters") from None
    return options


def _read_license(value: Any) -> tuple[str, ...]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise HTTPError(400, "'license' must be a string or an array of strings", param="license")
    return tuple(_bounded_text("license", text) for text in texts if text)


def _bounded_text(name: str, text: str) -> str:
    if len(text) > MAX_TEXT_CHARS:
        raise HTTPError(400, f"'{name}' is {len(text)} characters; at most {MAX_TEXT_CHARS} are allowed", param=name)
    return text


def _read_messages(messages: list) -> tuple[dict, ...]:
    if not messages:
        return ()
    try:
        normalize_messages(messages)  # the roles and contents every chat request is checked for
    except InvalidOptionError as exc:
        raise HTTPError(400, f"invalid 'messages': {exc}", param="messages") from None
    kept = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str):
            raise HTTPError(400, "each of 'messages' needs a 'content' string", param="messages")
        kept.append({"role": message["role"], "content": _bounded_text("messages", content)})
    return tuple(kept)


def _check_template(template: str) -> None:
    """400 unless the template compiles as a chat template (Jinja, as GGUF files carry them)."""
    if not template:
        return
    try:
        ChatTemplate(template)
    except PyEngineError as exc:
        hint = (" (this looks like an Ollama Go template; this server renders Jinja chat templates, "
                "as GGUF files carry them)") if _GO_TEMPLATE.search(template) else ""
        raise HTTPError(400, f"template error: {exc}{hint}", param="template") from None


# --------------------------------------------------------------------------------------
# /api/copy
# --------------------------------------------------------------------------------------


@router.post("/api/copy")
async def api_copy(request: Request) -> Response:
    state = state_of(request)
    fields = await read_fields(request)
    fields.reject_unknown({"source", "destination"})
    source = fields.string("source", required=True)
    destination = fields.string("destination", required=True)
    canonical, path = state.registry.resolve(source)
    try:
        target = store.created_name(destination)
    except PyEngineError as exc:
        raise HTTPError(400, str(exc), param="destination") from None
    if target in state.registry.served:
        raise HTTPError(400, f"cannot copy to {destination!r}: a model of that name was given at start-up",
                        param="destination")
    if target == canonical:
        raise HTTPError(400, "'source' and 'destination' name the same model", param="destination")
    if state.registry.get_loaded(target) is not None and not await state.registry.unload(target):
        raise HTTPError(409, f"model {destination!r} is in use; try again when its requests have finished")
    await run_in_threadpool(store.copy_model, canonical, path, target)
    return Response(status_code=200)


# --------------------------------------------------------------------------------------
# /api/blobs/:digest
# --------------------------------------------------------------------------------------


def _digest(digest: str) -> str:
    try:
        return store.blob_digest(digest)
    except InvalidOptionError as exc:
        raise HTTPError(400, str(exc)) from None


@router.head("/api/blobs/{digest}")
async def head_blob(digest: str) -> Response:
    return Response(status_code=200 if store.has_blob(_digest(digest)) else 404)


@router.post("/api/blobs/{digest}")
async def create_blob(request: Request, digest: str) -> Response:
    """The body is the file: streamed to disk, hashed as it comes, kept only when its sha256
    is the digest (201; 400 otherwise), within the upload limit and the free disk space."""
    digest = _digest(digest)
    if store.has_blob(digest):
        async for _ in request.stream():  # read to the end, so the client sees the answer
            pass
        return Response(status_code=200)
    declared = request.headers.get("content-length")
    limit = state_of(request).config.max_blob_bytes
    try:
        upload = store.BlobUpload(digest, limit, int(declared) if declared and declared.isdigit() else None)
    except store.BlobError as exc:
        raise HTTPError(exc.status, str(exc)) from None
    with upload:
        try:
            await _receive_into(request, upload)
            await run_in_threadpool(upload.commit)
        except ClientDisconnect:
            return Response(status_code=499)  # the client is gone; the partial file went with the upload
        except store.BlobError as exc:
            raise HTTPError(exc.status, str(exc)) from None
    return Response(status_code=201)


async def _receive_into(request: Request, upload: store.BlobUpload) -> None:
    pending: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        pending.append(chunk)
        size += len(chunk)
        if size >= WRITE_BATCH_BYTES:
            await run_in_threadpool(upload.write, b"".join(pending))
            pending, size = [], 0
    if pending:
        await run_in_threadpool(upload.write, b"".join(pending))


__all__ = ["read_parameters", "router"]
