"""The HTTP server: Ollama's API (/api/*) and OpenAI's (/v1/*) on one ASGI app.

    from pyengine.server import ServerConfig, create_app, serve
    serve(ServerConfig(port=11434))          # what `pyengine serve` runs

Safe by default: it binds 127.0.0.1, refuses another address without an API key
(unless ``insecure``), allows browsers from loopback origins only, caps request bodies,
and answers 503 (with Retry-After) once ``parallel + max_queue`` requests are in flight.
"""

from pyengine.server.config import ServerConfig, check_bind

__all__ = ["ServerConfig", "check_bind", "create_app", "resolve_served", "serve"]


def __getattr__(name):
    # The app pulls in FastAPI and the store; `pyengine --help` imports only the config.
    if name in ("create_app", "resolve_served", "serve"):
        from pyengine.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'pyengine.server' has no attribute {name!r}")
