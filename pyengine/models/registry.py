"""Architecture registry: GGUF `general.architecture` -> model class."""

from __future__ import annotations

from typing import Callable

from pyengine.errors import UnknownArchitectureError

_MODELS: dict[str, type] = {}


def register(*names: str) -> Callable[[type], type]:
    """Class decorator: `@register("llama", "mistral")`."""

    def add(cls: type) -> type:
        for name in names:
            if name in _MODELS and _MODELS[name] is not cls:
                raise ValueError(f"architecture '{name}' is registered twice")
            _MODELS[name] = cls
        return cls

    return add


def model_for_arch(arch: str) -> type:
    cls = _MODELS.get(arch)
    if cls is None:
        known = ", ".join(sorted(_MODELS)) or "none"
        raise UnknownArchitectureError(f"unknown model architecture '{arch}' (supported: {known})")
    return cls


def architectures() -> list[str]:
    return sorted(_MODELS)
