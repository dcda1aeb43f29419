"""What the listing endpoints say about a model file, read from its GGUF header
(cached per file version, so listing stays cheap)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from pyengine import store
from pyengine.gguf import StringArray
from pyengine.chat.capabilities import capabilities as chat_capabilities
from pyengine.chat.renderers import file_renderer
from pyengine.errors import PyEngineError
from pyengine.summary import Header, read_header


@dataclass(frozen=True)
class ModelFacts:
    path: Path
    size: int
    modified: float
    architecture: str
    n_params: int
    quantization: str
    template: str          # the file's chat template, or the renderer's when it has none
    metadata: dict
    renderer: str = ""     # the renderer's name when the file has no template


def model_facts(path: Path) -> ModelFacts:
    stat = os.stat(path)
    return _read_facts(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _read_facts(path: str, mtime_ns: int, size: int) -> ModelFacts:
    header = read_header(path)
    metadata = header.metadata
    arch = metadata.get("general.architecture")
    renderer = file_renderer(metadata)
    return ModelFacts(
        path=Path(path), size=size, modified=mtime_ns / 1e9,
        architecture=arch if isinstance(arch, str) else "unknown",
        n_params=header.n_params,
        quantization=_quantization(header),
        template=renderer.template if renderer is not None else metadata.get("tokenizer.chat_template") or "",
        metadata=metadata,
        renderer=renderer.name if renderer is not None else "",
    )


def _quantization(header: Header) -> str:
    file_type = header.metadata.get("general.file_type")
    if isinstance(file_type, int):
        try:
            import gguf

            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except (ValueError, ImportError):
            pass
    counts = header.type_counts()
    return counts.most_common(1)[0][0] if counts else "unknown"


def parameter_size(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


def details(facts: ModelFacts) -> dict:
    return {"parent_model": "", "format": "gguf", "family": facts.architecture,
            "families": [facts.architecture], "parameter_size": parameter_size(facts.n_params),
            "quantization_level": facts.quantization}


def digest(name: str) -> str:
    entry = store.catalog().get(name)
    return entry.sha256 if entry is not None else ""


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


def capabilities(facts: ModelFacts, *, has_projector: bool = False) -> list[str]:
    """What the model can be asked to do, by the rules requests are checked with
    (:mod:`pyengine.chat.capabilities`): from its metadata, the template it is rendered
    with and its vocabulary's special tokens (read once per file version)."""
    return list(_capabilities(str(facts.path), facts.modified, facts.size, facts.template, has_projector))


@functools.lru_cache(maxsize=32)
def _capabilities(path: str, modified: float, size: int, template: str, has_projector: bool) -> tuple[str, ...]:
    from pyengine.tokenizer.vocab import Vocab

    metadata = model_facts(Path(path)).metadata
    try:
        special = Vocab.from_metadata(metadata).special
    except PyEngineError:  # a vocabulary the model cannot load with: no FIM either
        special = {}
    return chat_capabilities(metadata, template, special, has_projector=has_projector)


def model_info(facts: ModelFacts, verbose: bool) -> dict:
    """The GGUF metadata as JSON values; long arrays (the vocabulary) only when verbose."""
    info: dict[str, Any] = {"general.parameter_count": facts.n_params}
    for key, value in facts.metadata.items():
        if key == "tokenizer.chat_template":
            continue
        info[key] = _json_value(value, verbose)
    return info


def _json_value(value: Any, verbose: bool) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist() if verbose else None
    if isinstance(value, (list, tuple, StringArray)):
        if not verbose and len(value) > 64:
            return None
        return [_json_value(item, True) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value != value:
        return None
    return value


__all__ = ["ModelFacts", "capabilities", "details", "digest", "model_facts", "model_info", "parameter_size",
           "rfc3339"]
