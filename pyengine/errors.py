"""Typed exceptions: every error a user can cause derives from PyEngineError."""


class PyEngineError(Exception):
    """Base class of every error pyengine raises on purpose."""


class ModelNotFoundError(PyEngineError, FileNotFoundError):
    """A model name or path that names nothing pyengine can find."""


class GGUFError(PyEngineError, ValueError):
    """A file that is not a valid GGUF file (bad magic, truncated, inconsistent)."""


class UnsupportedError(PyEngineError, NotImplementedError):
    """Something valid that pyengine does not (yet) run: a block type, a feature."""


class UnknownArchitectureError(UnsupportedError):
    """A GGUF whose general.architecture has no registered model."""


class ModelError(PyEngineError, ValueError):
    """A model whose tensors or hyper-parameters contradict each other."""


class TokenizerError(PyEngineError, ValueError):
    """A vocabulary that cannot be used, or text/ids it cannot handle."""


class InvalidOptionError(PyEngineError, ValueError):
    """An unknown option, or one whose value is out of range."""


class ContextLengthError(PyEngineError, ValueError):
    """A prompt (or generation) that does not fit in the context window."""


class GrammarError(PyEngineError, ValueError):
    """A GBNF grammar or JSON schema that cannot be compiled."""


class TemplateError(PyEngineError, ValueError):
    """A chat template that failed to render."""


class TemplateSecurityError(TemplateError):
    """A chat template that tried to escape the sandbox."""


class StoreError(PyEngineError):
    """A model download, verification or extraction that failed."""


class ImageError(PyEngineError, ValueError):
    """Image bytes that cannot be used: not an image, truncated, a format pyengine does
    not decode, or more pixels than the cap (the server answers 400)."""


class NativeError(PyEngineError, RuntimeError):
    """The native core reported an error for the inputs it was given."""


class SamplingError(PyEngineError, ValueError):
    """Logits the sampler cannot draw from (NaN, +inf, nothing finite) or a grammar dead end."""


class UnsupportedCapabilityError(InvalidOptionError):
    """A request that needs a capability the model lacks (tools, thinking, insert, ...),
    worded as Ollama words it: ``"<model>" does not support <what>``."""

    def __init__(self, model: str, capability: str, what: str | None = None) -> None:
        self.model = model
        self.capability = capability
        self.what = what or capability
        super().__init__(f"{_go_quoted(model)} does not support {self.what}")

    def for_model(self, model: str) -> "UnsupportedCapabilityError":
        """The same error naming the model as the request named it."""
        return UnsupportedCapabilityError(model, self.capability, self.what)


def _go_quoted(text: str) -> str:
    """`text` in double quotes with quotes and backslashes escaped (Go's %q for plain names)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
