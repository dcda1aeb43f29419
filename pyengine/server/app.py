"""The ASGI app (Ollama's /api/* and OpenAI's /v1/* on one FastAPI app) and `serve`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from pyengine import store
from pyengine.errors import InvalidOptionError, PyEngineError
from pyengine.server import create, embeddings, infill, metrics, ollama, openai, page, responses
from pyengine.server.common import ServerState
from pyengine.server.config import ServerConfig, check_bind, is_loopback_host
from pyengine.server.errors import HTTPError, error_response, from_engine_error
from pyengine.server.registry import Admission, Loader, ModelRegistry
from pyengine.server.security import LOOPBACK_NAMES, ApiKeyAuth, BodyLimit, HostCheck, OriginCheck, add_cors

log = logging.getLogger("pyengine.server")
_SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def resolve_served(models: tuple[str, ...] | list[str], pull: bool = True) -> dict[str, Path]:
    """Names and files of the models given at start-up: store names (pulled if needed)
    and .gguf paths, served under their file name without the suffix."""
    served: dict[str, Path] = {}
    for item in models:
        if "/" in item or "\\" in item or item.lower().endswith(".gguf") or item.startswith("~"):
            path = store.resolve_model(item, pull=False)
            name = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name
            if not _SERVED_NAME.fullmatch(name) or ".." in name:
                raise InvalidOptionError(f"cannot serve {item}: rename the file to letters, digits, '.', '_', '-'")
            served[store.canonical_name(name)] = path.resolve()
        else:
            name = store.canonical_name(item)
            served[name] = store.resolve_model(name, pull=pull, progress=pull)
    return served


def create_app(config: ServerConfig | None = None, *, loader: Loader | None = None,
               served: dict[str, Path] | None = None, preload: bool = False) -> FastAPI:
    """The server app. `loader(name, path, config)` makes a model adapter (default: an LLM);
    `served` maps extra model names to files (default: from ``config.models``); `preload`
    loads the first of them at start-up (what /health waits for)."""
    config = config or ServerConfig()
    if served is None:
        served = resolve_served(config.models, pull=False)
    registry = ModelRegistry(config, loader=loader, served=served)
    state = ServerState(config, registry, Admission(config.capacity))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        sweeper = asyncio.create_task(_sweep_forever(registry, config.sweep_interval_s))
        preloader = asyncio.create_task(registry.preload()) if preload else None
        try:
            yield
        finally:
            for task in (sweeper, preloader):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await registry.close()

    app = FastAPI(title="pyengine", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.pyengine = state
    app.include_router(ollama.router)
    app.include_router(openai.router)
    app.include_router(responses.router)
    app.include_router(embeddings.router)
    app.include_router(infill.router)
    app.include_router(create.router)
    app.include_router(metrics.router)
    app.include_router(page.router)
    _add_error_handlers(app)
    # Added innermost first: requests pass the origin check, CORS, then the host check, the key,
    # the body limit.
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    if config.api_key:
        app.add_middleware(ApiKeyAuth, api_key=config.api_key)
    allowed_hosts = LOOPBACK_NAMES | {config.host.lower()} if is_loopback_host(config.host) else None
    app.add_middleware(HostCheck, allowed=allowed_hosts)
    add_cors(app, config.cors_origins)
    app.add_middleware(OriginCheck, allowed=config.cors_origins)
    app.add_middleware(metrics.RequestMetrics, metrics=state.metrics)  # outermost: counts refusals too
    return app


async def _sweep_forever(registry: ModelRegistry, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await registry.sweep()
        except Exception:  # never let one bad unload stop the sweeper
            log.exception("unloading an idle model failed")


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HTTPError)
    async def on_http_error(request: Request, exc: HTTPError):
        return error_response(request.url.path, exc)

    @app.exception_handler(PyEngineError)
    async def on_engine_error(request: Request, exc: PyEngineError):
        return error_response(request.url.path, from_engine_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def on_starlette_error(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return error_response(request.url.path, HTTPError(exc.status_code, message, headers=exc.headers))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        return error_response(request.url.path, HTTPError(400, f"invalid request: {exc.errors()}"))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(request.url.path, HTTPError(500, f"internal error: {type(exc).__name__}: {exc}"))


def serve(config: ServerConfig) -> None:
    """Check the bind, resolve (and pull) the start-up models, and run uvicorn until stopped."""
    import uvicorn

    check_bind(config)
    served = resolve_served(config.models, pull=True)
    app = create_app(config, served=served, preload=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level="info", timeout_graceful_shutdown=5)


__all__ = ["create_app", "resolve_served", "serve"]
