"""pyengine: local LLM inference for Python (GGUF models, CPU kernels in C)."""

from pyengine.errors import (  # noqa: F401
    ContextLengthError,
    GGUFError,
    InvalidOptionError,
    ModelNotFoundError,
    PyEngineError,
    UnknownArchitectureError,
    UnsupportedError,
)

__version__ = "0.1.0"


def __getattr__(name):
    # The Python API pulls in the native core; import it only when asked for.
    if name == "LLM":
        from pyengine.api import LLM
        return LLM
    raise AttributeError(f"module 'pyengine' has no attribute {name!r}")
