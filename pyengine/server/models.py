"""One loaded model as the server sees it: :class:`ModelAdapter`.

The routes never touch an `LLM` directly; they ask an adapter to start a reply and
get a :class:`~pyengine.session.ChatStream` back. Tests swap in a fake adapter
with the same methods to make timing deterministic.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from pyengine import session, store
from pyengine.errors import PyEngineError
from pyengine.kvcache import DEFAULT_CHECKPOINTS
from pyengine.options import context_limit
from pyengine.runner.engine import state_rows
from pyengine.server import info
from pyengine.server.config import ServerConfig
from pyengine.server.errors import HTTPError
from pyengine.vision.files import projector_beside

DEFAULT_CTX = 4096          # the LLM's default context (api.DEFAULT_CTX), capped at the trained one
KV_BYTES_PER_VALUE = 2      # f16 cache rows, the default type: an upper bound for the quantized ones
STATE_BYTES_PER_VALUE = 4   # recurrent states are float32 (kvcache/recurrent.py)


@dataclass(frozen=True)
class ContextLimits:
    """What a model file says about the context sizes it can be loaded with."""

    trained: int | None          # `<arch>.context_length`; None when the file does not say
    default: int                 # the size a request without num_ctx gets
    kv_bytes_per_cell: int       # KV cache bytes per cell, over all layers (0: no attention cache)
    state_bytes_per_row: int = 0  # one recurrent state over the recurrent layers (0: none)

    @property
    def largest(self) -> int | None:
        """The largest num_ctx a request may ask for: the trained context, or the server's own
        context where that was set larger (None: no limit known)."""
        return None if self.trained is None else max(self.trained, self.default)

    def kv_bytes(self, n_ctx: int, parallel: int) -> int:
        """The KV cache an instance of `n_ctx` tokens per sequence holds (the engine keeps
        n_ctx cells for each of its `parallel` sequences), with the recurrent state rows its
        sequences and their checkpoints take (runner/engine.py's state_rows)."""
        states = self.state_bytes_per_row * state_rows(parallel, DEFAULT_CHECKPOINTS) if self.state_bytes_per_row else 0
        return self.kv_bytes_per_cell * n_ctx * parallel + states


def context_limits(path: Path, config: ServerConfig) -> ContextLimits:
    """The context limits of the model at `path`, read from its GGUF header (cached);
    a file that cannot be read gives no trained limit and no KV estimate (its load will say why)."""
    try:
        metadata = info.model_facts(Path(path)).metadata
    except (OSError, ValueError):
        metadata = {}
    arch = metadata.get("general.architecture")
    trained = _positive(metadata.get(f"{arch}.context_length"))
    default = config.n_ctx or min(trained or DEFAULT_CTX, DEFAULT_CTX)
    return ContextLimits(trained, default, _kv_bytes_per_cell(metadata, arch), _state_bytes_per_row(metadata, arch))


def _kv_bytes_per_cell(metadata: dict, arch: Any) -> int:
    """K and V widths summed over the layers, as llama.cpp sizes its cache; sliding-window
    layers are counted in full, so this is an upper bound."""
    n_layers = _positive(metadata.get(f"{arch}.block_count")) or 0
    heads = _per_layer(metadata.get(f"{arch}.attention.head_count"), n_layers)
    kv_heads = _per_layer(metadata.get(f"{arch}.attention.head_count_kv"), n_layers) or heads
    n_embd = _positive(metadata.get(f"{arch}.embedding_length")) or 0
    recurrent = _recurrent_layers(metadata, arch, n_layers)
    total = 0
    for layer, (n_head, n_kv) in enumerate(zip(heads, kv_heads)):
        if not n_head or layer in recurrent:
            continue  # a recurrent layer: its state does not grow with the context
        k_dim = _positive(metadata.get(f"{arch}.attention.key_length")) or n_embd // n_head
        v_dim = _positive(metadata.get(f"{arch}.attention.value_length")) or n_embd // n_head
        if _is_latent_cache(metadata, arch):
            v_dim = 0   # MLA: the one row of latent + rope values (key_length) serves as K and V
        total += (n_kv or n_head) * (k_dim + v_dim)
    return total * KV_BYTES_PER_VALUE


def _is_latent_cache(metadata: dict, arch: Any) -> bool:
    """Whether the file keeps multi-head latent attention's compressed cache (DeepSeek-2's
    split attn_k_b / attn_v_b form: a kv_lora_rank and per-head *_mla sizes), whose rows
    of key_length values hold the latent that V is read from."""
    return bool(_positive(metadata.get(f"{arch}.attention.kv_lora_rank"))
                and _positive(metadata.get(f"{arch}.attention.key_length_mla")))


def _recurrent_layers(metadata: dict, arch: Any, n_layers: int) -> set[int]:
    """The layers that keep a recurrent state: none without `ssm.*` hyper-parameters; else
    those without attention heads, or all but every `full_attention_interval`-th (Qwen3-Next,
    Qwen3.5), as llama.cpp tells them apart."""
    if not _positive(metadata.get(f"{arch}.ssm.state_size")):
        return set()
    interval = _positive(metadata.get(f"{arch}.full_attention_interval"))
    if interval:
        return {i for i in range(n_layers) if (i + 1) % interval}
    heads = _per_layer(metadata.get(f"{arch}.attention.head_count_kv"), n_layers) or \
        _per_layer(metadata.get(f"{arch}.attention.head_count"), n_layers)
    return {i for i in range(n_layers) if i >= len(heads) or not heads[i]}


def _state_bytes_per_row(metadata: dict, arch: Any) -> int:
    """One recurrent state in float32, as llama.cpp sizes its r and s rows: per recurrent
    layer the convolution window ((kernel - 1) x the conv channels, d_inner + 2 x groups x
    d_state) and the SSM / delta-rule state (d_state x d_inner)."""
    n_layers = _positive(metadata.get(f"{arch}.block_count")) or 0
    layers = _recurrent_layers(metadata, arch, n_layers)
    d_state = _positive(metadata.get(f"{arch}.ssm.state_size")) or 0
    d_inner = _positive(metadata.get(f"{arch}.ssm.inner_size")) or 0
    kernel = _positive(metadata.get(f"{arch}.ssm.conv_kernel")) or 1
    groups = _positive(metadata.get(f"{arch}.ssm.group_count")) or 1
    per_layer = (kernel - 1) * (d_inner + 2 * groups * d_state) + d_state * d_inner
    return len(layers) * per_layer * STATE_BYTES_PER_VALUE


def _per_layer(value: Any, n_layers: int) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [int(value)] * n_layers
    try:
        return [int(v) for v in list(value)[:n_layers]]
    except (TypeError, ValueError):
        return []


def _positive(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 and not isinstance(value, bool) else None


def projector_for(path: Path, config: ServerConfig) -> Path | None:
    """The vision projector a served model is loaded with: --mmproj for the first --model,
    else MODEL.mmproj.gguf beside the model's file."""
    if config.mmproj and config.models and _same_file(config.models[0], path):
        return Path(config.mmproj)
    return projector_beside(path)


def speculation_for(path: Path, config: ServerConfig) -> dict[str, Any]:
    """The LLM's draft model and default speculation: --draft-model goes with the first
    --model; a default of "draft" applies only to a model that has one."""
    kwargs: dict[str, Any] = {}
    if config.draft_model and config.models and _same_file(config.models[0], path):
        kwargs["draft_model"] = config.draft_model
    if config.speculative == "ngram" or (config.speculative == "draft" and kwargs):
        kwargs["speculative"] = config.speculative
    return kwargs


def _same_file(name: str, path: Path) -> bool:
    try:
        return Path(name).resolve() == Path(path).resolve() or store.resolve_model(name, pull=False) == Path(path)
    except (PyEngineError, OSError):  # a name the store does not hold: not this file
        return False


class ModelAdapter:
    """Starts replies of one LLM; the only server code that calls into it."""

    def __init__(self, name: str, path: Path, llm: Any) -> None:
        self.name = name
        self.path = Path(path)
        self.llm = llm

    @classmethod
    def load(cls, name: str, path: Path, config: ServerConfig) -> "ModelAdapter":
        from pyengine.api import LLM

        # config.n_ctx is the size the registry chose for this instance (a request's num_ctx or the default)
        kwargs: dict[str, Any] = {"n_ctx": config.n_ctx, "n_threads": config.n_threads}
        if "n_parallel" in inspect.signature(LLM).parameters:  # the batching engine
            kwargs["n_parallel"] = config.parallel
        projector = projector_for(path, config)
        if projector is not None:
            kwargs["mmproj"] = str(projector)
        kwargs.update(speculation_for(path, config))
        llm = LLM(str(path), **kwargs)
        created = store.created_model(name)
        if created is not None and created.template and created.file == Path(path):
            session.use_template(llm, created.template)  # a created model's template replaces the file's
        return cls(name, path, llm)

    # ---- what the routes call ----------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.llm.n_ctx

    def stats(self) -> dict:
        """The engine's live and waiting sequences and KV cells in use (for /metrics)."""
        return self.llm.stats()

    def token_bytes(self, token: int) -> bytes:
        return self.llm.tokenizer.token_to_bytes(token)

    def start_chat(self, messages: Any, *, tools: Any = None, tool_choice: Any = None, format: Any = None,
                   think: Any = None, options: dict) -> session.ChatStream:
        return session.start_chat(self.llm, messages, tools=tools, tool_choice=tool_choice, format=format,
                                  think=think, **options)

    def start_generate(self, prompt: str, *, system: str | None = None, raw: bool = False,
                       context: Sequence[int] | None = None, format: Any = None, think: Any = None,
                       suffix: str | None = None, history: Sequence[dict] = (), images: Sequence = (),
                       options: dict) -> session.ChatStream:
        """Ollama's /api/generate: the prompt as one user turn (or raw), after `context`;
        with a `suffix`, the middle between prompt and suffix (no template, no system).
        `history`: a created model's messages, between the system prompt and the prompt."""
        session.require_capabilities(self.llm, route="generate", think=think, insert=bool(suffix))
        if images and (suffix or raw):
            raise HTTPError(400, "'images' go with a templated prompt, not with 'raw' or 'suffix'", param="images")
        if suffix:
            n_ctx = context_limit(self.llm.n_ctx, options.get("num_ctx"))
            prepared = session.prepare_infill(self.llm, prompt, suffix, n_ctx=n_ctx,
                                              n_predict=options.get("num_predict"))
        elif raw:
            prepared = session.prepare_prompt(self.llm, prompt, parse=True)
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + \
                       [dict(turn) for turn in history] + [{"role": "user", "content": prompt}]
            prepared = session.prepare_chat(self.llm, messages, think=think, images=list(images) or None)
        if context:
            before = session.prepare_prompt(self.llm, list(context)).ids
            images = tuple((start + len(before), rows) for start, rows in prepared.images)  # after the context
            # the reply is read as the prompt's own was (a harmony reply keeps its channels)
            prepared = replace(prepared, ids=before + prepared.ids, images=images, parse=not suffix)
        return session.start_prepared(self.llm, prepared, format=format, **options)

    def start_infill(self, prefix: str, suffix: str, *, extra: Sequence[Any] = (), prompt: str = "",
                     options: dict) -> session.ChatStream:
        """llama.cpp's /infill: the middle between `prefix` (then `prompt`) and `suffix`,
        with `extra` files of context before."""
        prepared = session.prepare_infill(self.llm, prefix, suffix, extra=extra, prompt=prompt,
                                          n_ctx=context_limit(self.llm.n_ctx, options.get("num_ctx")),
                                          n_predict=options.get("num_predict"))
        return session.start_prepared(self.llm, prepared, **options)

    def start_completion(self, prompt: str | list[int], *, format: Any = None,
                         options: dict) -> session.ChatStream:
        """OpenAI's /v1/completions: the prompt as is, the reply unparsed."""
        prepared = session.prepare_prompt(self.llm, prompt, parse=False)
        return session.start_prepared(self.llm, prepared, format=format, **options)

    def embed(self, inputs: list[str] | list[list[int]], *, normalize: bool = True, truncate: bool = True,
              pooling: str | None = None, dimensions: int | None = None) -> tuple[list, int]:
        """Pooled embeddings of the inputs and the number of tokens they took."""
        return self.llm.embed(inputs, normalize=normalize, truncate=truncate, return_count=True, pooling=pooling,
                              dimensions=dimensions)

    def rerank(self, query: str, documents: list[str], *, top_n: int | None = None) -> tuple[list[dict], int]:
        """The documents' ``{"index", "relevance_score"}`` best first, and the tokens scored."""
        return self.llm.rerank(query, documents, top_n=top_n, return_count=True)

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids)

    def close(self) -> None:
        close = getattr(self.llm, "close", None)
        if callable(close):
            close()


__all__ = ["ContextLimits", "ModelAdapter", "context_limits"]
