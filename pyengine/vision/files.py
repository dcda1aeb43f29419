"""Where a model's vision projector is kept: MODEL.mmproj.gguf beside MODEL.gguf."""

from __future__ import annotations

from pathlib import Path

PROJECTOR_SUFFIX = ".mmproj.gguf"


def projector_beside(path: str | Path) -> Path | None:
    """The projector stored beside the model at `path`, if there is one."""
    path = Path(path)
    candidate = path.with_name(path.name.removesuffix(".gguf") + PROJECTOR_SUFFIX)
    return candidate if candidate.is_file() and candidate != path else None


__all__ = ["PROJECTOR_SUFFIX", "projector_beside"]
