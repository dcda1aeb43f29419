"""What `pyengine show`, the REPL's /show and the server's /api/show say about a GGUF file:
rows read from its header only, and the number formats they use."""

from __future__ import annotations

import collections
import numbers
import os
from dataclasses import dataclass

from pyengine.chat.renderers import file_renderer
from pyengine.gguf import GGUFFile


@dataclass(frozen=True)
class Header:
    """A GGUF file's metadata and tensor descriptions (no tensor data is read)."""

    metadata: dict
    tensors: list

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def type_counts(self) -> collections.Counter:
        """Tensors per block type name."""
        return collections.Counter(t.type_name for t in self.tensors)


def read_header(path) -> Header:
    with GGUFFile(path) as gguf:
        return Header(dict(gguf.metadata), list(gguf.tensors.values()))


def model_summary(path) -> list[tuple[str, str]]:
    """(label, value) rows describing a GGUF file, read from its header only."""
    header = read_header(path)
    meta, tensors = header.metadata, header.tensors
    # Read leniently: show should describe a file even when it lacks keys a model needs.
    arch = meta.get("general.architecture")

    def hparam(name: str) -> str:
        return format_value(meta.get(f"{arch}.{name}"))

    types = ", ".join(f"{name} x{count}" for name, count in header.type_counts().most_common())
    tokens = meta.get("tokenizer.ggml.tokens")
    tokenizer = format_value(meta.get("tokenizer.ggml.model"))
    if meta.get("tokenizer.ggml.pre") is not None:
        tokenizer += f" (pre: {meta['tokenizer.ggml.pre']})"
    template = meta.get("tokenizer.chat_template")
    experts = hparam("expert_count")
    if experts != "-":
        experts += f" ({hparam('expert_used_count')} used)"
    rows = [
        ("name", format_value(meta.get("general.name"))),
        ("architecture", format_value(arch)),
        ("parameters", human_count(header.n_params)),
        ("context length", hparam("context_length")),
        ("embedding length", hparam("embedding_length")),
        ("feed-forward length", hparam("feed_forward_length")),
        ("layers", hparam("block_count")),
        ("heads", hparam("attention.head_count")),
        ("kv heads", hparam("attention.head_count_kv")),
        ("head dim", hparam("attention.key_length")),
        ("sliding window", hparam("attention.sliding_window")),
        ("experts", experts),
        ("tensors", f"{len(tensors)} ({types})"),
        ("tokenizer", tokenizer),
        ("vocabulary", str(len(tokens)) if is_sequence(tokens) else "-"),
        ("chat template", f"yes ({len(template)} chars)" if isinstance(template, str) and template
         else f"no (prompted in the {renderer_name(meta)} format)"),
        ("capabilities", ", ".join(file_capabilities(meta))),
        ("size on disk", human_bytes(os.path.getsize(path))),
        ("path", str(path)),
    ]
    # Rows of features the model does not have (no experts, no window) say nothing.
    return [(label, value) for label, value in rows if value != "-"]


def file_capabilities(meta: dict) -> tuple[str, ...]:
    """What the model can be asked to do (:mod:`pyengine.chat.capabilities`), by the
    file's own chat template ("embedding" for an embedding model)."""
    from pyengine.chat.capabilities import capabilities
    from pyengine.errors import PyEngineError
    from pyengine.tokenizer.vocab import Vocab

    try:
        special = Vocab.from_metadata(meta).special
    except PyEngineError:   # a vocabulary the model cannot load with: no FIM either
        special = {}
    template = meta.get("tokenizer.chat_template")
    return capabilities(meta, template if isinstance(template, str) else "", special)


def is_sequence(value) -> bool:
    # Arrays may come as lists, tuples or numpy arrays, depending on the reader.
    return hasattr(value, "__len__") and not isinstance(value, (str, bytes, dict))


def format_value(value) -> str:
    if value is None:
        return "-"
    if is_sequence(value):
        # Per-layer values (e.g. kv heads of some models): show the spread, not 30 numbers.
        values = [v for v in value if isinstance(v, numbers.Real) and not isinstance(v, bool)]
        distinct = sorted(set(values)) if len(values) == len(value) else []
        if len(distinct) == 1:
            return str(distinct[0])
        if distinct:
            return f"{distinct[0]}-{distinct[-1]} (per layer)"
        return f"[{len(value)} values]"
    return str(value)


def renderer_name(meta: dict) -> str:
    renderer = file_renderer(meta)
    return renderer.name if renderer is not None else "chatml"


def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


def human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit} ({n:,})"
    return str(n)


__all__ = ["Header", "format_value", "human_bytes", "human_count", "model_summary", "read_header"]
