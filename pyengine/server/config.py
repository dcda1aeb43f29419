"""How a server is set up, and the check that it does not listen openly by accident."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from pyengine.errors import InvalidOptionError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 11434
DEFAULT_KEEP_ALIVE_S = 300.0
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_BLOB_BYTES = 256 << 30      # one upload to /api/blobs (the free disk space bounds it too)
API_KEY_ENV = "PYENGINE_API_KEY"


@dataclass
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    models: tuple[str, ...] = ()            # names or .gguf paths served besides the store's models
    parallel: int = 4                       # requests generating at once (per model, with the engine)
    max_queue: int = 64                     # requests waiting beyond those; more get 503
    api_key: str | None = None              # Bearer token required on every endpoint but "/"
    insecure: bool = False                  # allow a non-loopback address without an API key
    cors_origins: tuple[str, ...] = ()      # web page origins allowed besides loopback ones ("*": any)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES  # streamed uploads (/api/blobs), not held in memory
    keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S  # idle time before unloading (None: never)
    max_loaded_models: int = 3
    kv_memory_bytes: int | None = None      # KV caches the loaded models may hold together (None: half the RAM)
    n_ctx: int | None = None                # context per loaded model (None: the LLM's default)
    n_threads: int | None = None
    retry_after_s: int = 1                  # the Retry-After of a 503 when the queue is full
    sweep_interval_s: float = 1.0           # how often idle models are checked for expiry
    mmproj: str | None = None               # vision projector of the first of `models` (else one beside a model)
    draft_model: str | None = None          # draft model of the first of `models` (speculative="draft")
    speculative: str | None = None          # requests naming no speculation: "ngram", "draft" or None (off)
    remote_images: bool = False             # fetch http(s) image URLs in requests (bounded below)
    remote_image_bytes: int = 32 * 1024 * 1024
    remote_image_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.kv_memory_bytes is not None and (_not_int(self.kv_memory_bytes) or self.kv_memory_bytes < 1):
            raise InvalidOptionError(f"kv_memory_bytes must be a positive integer, got {self.kv_memory_bytes!r}")
        for name in ("parallel", "max_body_bytes", "max_blob_bytes", "max_loaded_models"):
            if _not_int(getattr(self, name)) or getattr(self, name) < 1:
                raise InvalidOptionError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if _not_int(self.max_queue) or self.max_queue < 0:
            raise InvalidOptionError(f"max_queue must be an integer >= 0, got {self.max_queue!r}")
        if _not_int(self.port) or not 0 <= self.port <= 65535:
            raise InvalidOptionError(f"port must be in [0, 65535], got {self.port!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise InvalidOptionError("the API key must be a non-empty string")
        self.models = tuple(self.models)
        self.cors_origins = tuple(self.cors_origins)

    @property
    def capacity(self) -> int:
        """Requests admitted at once: those generating plus those queued."""
        return self.parallel + self.max_queue

    @classmethod
    def with_env_key(cls, **kwargs) -> "ServerConfig":
        """A config whose API key falls back to $PYENGINE_API_KEY."""
        if not kwargs.get("api_key"):
            kwargs["api_key"] = os.environ.get(API_KEY_ENV) or None
        return cls(**kwargs)


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def is_loopback_host(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    text = host.strip().strip("[]").lower()
    if text == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def check_bind(config: ServerConfig) -> None:
    """Refuse to listen beyond loopback without an API key, unless told to (`insecure`)."""
    if is_loopback_host(config.host) or config.api_key or config.insecure:
        return
    raise InvalidOptionError(
        f"refusing to listen on {config.host} without an API key: anyone who can reach it could use it. "
        f"Set --api-key (or ${API_KEY_ENV}), bind 127.0.0.1, or pass --insecure"
    )


__all__ = ["API_KEY_ENV", "DEFAULT_HOST", "DEFAULT_PORT", "ServerConfig", "check_bind", "is_loopback_host"]
