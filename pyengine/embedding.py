"""Embeddings and reranking, run as engine work.

    vectors = embed_prompts(engine, [ids_a, ids_b, ...], pooling="mean")   # one array per prompt
    scores = rerank_scores(engine, tokenizer, metadata, "query", ["doc", ...])

Many inputs of one request go through the model together: their tokens are packed
into forward passes of up to n_batch tokens, each input in a sequence slot of its own
(as many slots at once as are free), a long input carried over to the next pass (an
encoder's input never is: it waits for a pass it fits in whole).  The
whole request runs in the engine thread between two generation steps (Engine.call),
so it never races a generation for the cache, and it gives its slots and cells back
before the next step.  An input's rows are the same bits whatever shares its passes
(the engine's batch invariance), and pooling reads them only once the input is
complete, so batching gives the vectors of one input at a time, bit for bit.

Pooling follows the file's ``{arch}.pooling_type`` (llama.cpp's numbering: 0 none,
1 mean, 2 cls, 3 last, 4 rank; a decoder without the key: mean), overridable per
request.  "none" gives one vector per token.  "rank" is a relevance score: a
cross-encoder's classification head (`model.classify(ctx, pooled)`) on the pooled
state, or, for a decoder without one (Qwen3-Reranker), p(yes) from its "yes" and "no"
logits after the reranking prompt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from pyengine.errors import ContextLengthError, InvalidOptionError, UnsupportedError

POOLINGS = ("none", "mean", "cls", "last", "rank")   # index: GGUF's {arch}.pooling_type
DEFAULT_POOLING = "mean"                              # a decoder's, as llama.cpp's --pooling mean

# Qwen3-Reranker's prompt (its model card; llama.cpp's converter writes the same rerank template)
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


class DimensionsError(InvalidOptionError):
    """A `dimensions` outside 1..the model's embedding size."""


# ---- what the file says -----------------------------------------------------------------


def model_pooling(metadata: Mapping) -> str:
    """The pooling the file declares (``{arch}.pooling_type``), mean where it declares none."""
    arch = metadata.get("general.architecture")
    value = metadata.get(f"{arch}.pooling_type")
    if value is None or value == -1:    # -1: llama.cpp's "unspecified"
        return DEFAULT_POOLING
    return pooling_name(value)


def pooling_name(value: object) -> str:
    """A pooling given by name or by GGUF number, as its name; InvalidOptionError otherwise."""
    if isinstance(value, str) and value in POOLINGS:
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < len(POOLINGS):
        return POOLINGS[int(value)]
    raise InvalidOptionError(f"pooling must be one of {', '.join(POOLINGS)} (or 0..{len(POOLINGS) - 1}), "
                             f"got {value!r}")


def is_embedding_model(metadata: Mapping) -> bool:
    """Whether a model only embeds (no text to generate): its file declares a pooling
    type (how Ollama tells embedding models apart), or its architecture's model has no
    LM head (an encoder: its class says ``EMBEDDING_ONLY = True``, models/common.py)."""
    arch = metadata.get("general.architecture")
    if f"{arch}.pooling_type" in metadata:
        return True
    from pyengine.models.registry import architectures, model_for_arch

    return arch in architectures() and getattr(model_for_arch(arch), "EMBEDDING_ONLY", False)


# ---- vectors ---------------------------------------------------------------------------------


def pool(rows: np.ndarray, pooling: str) -> np.ndarray:
    """One input's vector from its hidden rows [n_tokens, n_embd] (float32); "none"
    keeps every row.  The mean sums in float64, in position order."""
    if pooling == "none":
        return rows.astype(np.float32)
    if pooling == "mean":
        return (rows.sum(axis=0, dtype=np.float64) / len(rows)).astype(np.float32)
    if pooling == "cls":
        return rows[0].astype(np.float32)
    if pooling == "last":
        return rows[-1].astype(np.float32)
    raise InvalidOptionError(f"pooling {pooling!r} gives no vector to pool")


def normalized(vector: np.ndarray) -> np.ndarray:
    """`vector` (or each row of a matrix) scaled to unit L2 length; zero stays zero."""
    v = np.asarray(vector, np.float64)
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return (v / np.where(norm > 0, norm, 1.0)).astype(np.float32)


def shortened(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first `dimensions` components of each vector, back to unit length (Matryoshka
    truncation, OpenAI's and Ollama's `dimensions`)."""
    if dimensions is None:
        return vector
    width = vector.shape[-1]
    if isinstance(dimensions, bool) or not isinstance(dimensions, (int, np.integer)) or not 1 <= dimensions <= width:
        raise DimensionsError(f"dimensions must be an integer in 1..{width} (the model's embedding size), "
                              f"got {dimensions!r}")
    return normalized(vector[..., :dimensions])


def embed_prompts(engine, prompts: Sequence[list[int]], pooling: str, *, normalize: bool = True,
                  dimensions: int | None = None) -> list[np.ndarray]:
    """Each prompt's embedding (float32; [n_tokens, d] for pooling "none"), all prompts
    batched into shared forward passes, run in the engine thread."""
    pooling = pooling_name(pooling)
    if pooling == "rank":
        scores = engine.call(lambda: _rank_in_engine(engine, prompts))
        return [np.asarray(s, np.float32) for s in scores]

    def run() -> list[np.ndarray]:
        rows = run_rows(engine, prompts, lambda n: np.arange(n), hidden=True)
        return [pool(r, pooling) for r in rows]

    vectors = engine.call(run) if prompts else []
    if normalize:
        vectors = [normalized(v) for v in vectors]
    return [shortened(v, dimensions) for v in vectors]


# ---- scores ----------------------------------------------------------------------------------


def rerank_prompts(tokenizer, metadata: Mapping, model, query: str, documents: Sequence[str]) -> list[list[int]]:
    """The token ids each (query, document) pair is scored from, as llama.cpp's server
    builds them: the file's rerank template with {query} and {document} filled in (its
    special tokens parsed), else ``[BOS] query [EOS] [SEP] document [EOS]`` with the
    markers the vocabulary adds; a decoder without a classification head and without a
    template gets Qwen3-Reranker's prompt."""
    template = metadata.get(RERANK_TEMPLATE_KEY)
    if template is None and not hasattr(model, "classify"):
        template = QWEN3_RERANK_TEMPLATE
    if template is not None:
        return [tokenizer.encode(template.replace("{query}", query).replace("{document}", doc),
                                 add_special=False, parse_special=True) for doc in documents]
    eos = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
    head = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    end = [eos] if tokenizer.add_eos and eos is not None else []
    mid = [tokenizer.sep_id] if tokenizer.vocab.flags.add_sep and tokenizer.sep_id is not None else []
    q = tokenizer.encode(query, add_special=False, parse_special=False)
    return [head + q + end + mid + tokenizer.encode(doc, add_special=False, parse_special=False) + end
            for doc in documents]


def rank_order(scores: Sequence[float], top_n: int | None = None) -> list[dict]:
    """``[{"index", "relevance_score"}]`` best first (ties by index), the first `top_n`."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if top_n is not None:
        order = order[:top_n]
    return [{"index": i, "relevance_score": float(scores[i])} for i in order]


def _rank_in_engine(engine, prompts: Sequence[list[int]]) -> list[np.ndarray]:
    """Each prompt's rank output: the model's classification head on its pooled state
    (the first token's of an encoder, the mean of ModernBERT's, the last one's of a
    causal model, as llama.cpp reads them), or [p(yes)] from a decoder's yes/no logits.  In the engine thread."""
    if not prompts:
        return []
    model = engine.model
    if hasattr(model, "classify"):
        row = _rank_row(model)
        rows = run_rows(engine, prompts, lambda n: np.arange(n), hidden=True)
        pooled = np.stack([pool(r, row) for r in rows]).astype(np.float32)
        return list(classify(model, engine.backend, pooled))
    yes, no = yes_no_ids(engine.tokenizer)
    last = run_rows(engine, prompts, lambda n: np.array([n - 1]), hidden=False)
    return [np.array([yes_probability(r[0, yes], r[0, no])], np.float32) for r in last]


def _rank_row(model) -> str:
    """Which pooling a classification head reads: the model's own where it says
    (ModernBERT's mean), else the last token's of a causal model, the first of an encoder."""
    from pyengine.models.common import Decoder

    if hasattr(model, "rank_pooling"):
        return model.rank_pooling()
    return "last" if isinstance(model, Decoder) else "cls"


def classify(model, backend, pooled: np.ndarray) -> np.ndarray:
    """The model's classification head on pooled states [n, n_embd]: [n, n_labels]."""
    from pyengine.ml.context import Context

    ctx = Context(backend)
    x = ctx.input(np.ascontiguousarray(pooled, np.float32), "pooled")     # [n_embd, n]
    out = model.classify(ctx, x)                                           # [n_labels, n]
    ctx.set_output(out)
    ctx.compute()
    return np.array(ctx.read(out), np.float32).reshape(len(pooled), -1)


def yes_no_ids(tokenizer) -> tuple[int, int]:
    """The tokens "yes" and "no" (one token each in a reranker's vocabulary)."""
    ids = []
    for word in ("yes", "no"):
        found = tokenizer.encode(word, add_special=False, parse_special=False)
        if len(found) != 1:
            raise UnsupportedError(f"the vocabulary has no single token for {word!r}; this model cannot rerank")
        ids.append(found[0])
    return ids[0], ids[1]


def yes_probability(logit_yes: float, logit_no: float) -> float:
    """softmax(logit_yes, logit_no)[yes], as Qwen3-Reranker scores a pair."""
    return float(1.0 / (1.0 + np.exp(float(logit_no) - float(logit_yes))))


# ---- the batched runner --------------------------------------------------------------------------


@dataclass(eq=False)
class _Input:
    """One prompt in flight: its tokens, the rows kept and where it got to."""

    ids: list[int]
    wanted: np.ndarray                   # prompt positions whose rows are kept, increasing
    rows: np.ndarray                     # [len(wanted), width]
    fed: int = 0                         # tokens already through the model
    kept: int = 0                        # rows already filled
    slot: object = None

    def cached(self) -> tuple[list[int], int]:
        """As a live sequence answers the slot table: nothing another request may reuse."""
        return [], 0


@dataclass(eq=False)
class _Pass:
    """The chunks of one forward pass: (input, first position, token count)."""

    chunks: list[tuple[_Input, int, int]] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(count for _, _, count in self.chunks)


def run_rows(engine, prompts: Sequence[list[int]], wanted_rows, *, hidden: bool) -> list[np.ndarray]:
    """For each prompt, the rows `wanted_rows(n_tokens)` of its final-norm hidden states
    (`hidden`) or logits, computed in shared forward passes of up to n_batch tokens.
    Runs in the engine thread; every slot and cell it takes is given back."""
    width = engine.model.cfg.n_embd if hidden else engine.n_vocab
    waiting = deque()
    for ids in prompts:
        wanted = np.asarray(wanted_rows(len(ids)), np.int64)
        waiting.append(_Input(list(ids), wanted, np.empty((len(wanted), width), np.float32)))
    inputs = list(waiting)
    active: list[_Input] = []
    try:
        while waiting or active:
            step = _plan(engine, waiting, active)
            _run_pass(engine, step, hidden)
            for item in [i for i in active if i.fed == len(i.ids)]:
                _release(engine, item)
                active.remove(item)
    finally:
        for item in active:
            _release(engine, item)
    return [item.rows for item in inputs]


def _plan(engine, waiting: deque, active: list[_Input]) -> _Pass:
    """The next pass: the inputs under way first, then new ones while tokens (n_batch,
    and the cells free for them) and free slots last."""
    left = sum(len(item.ids) - item.fed for item in active) + sum(len(item.ids) for item in waiting)
    step, budget = _Pass(), reserve_cells(engine, min(engine.n_batch, left))
    for item in active:
        if budget == 0:
            break
        count = min(budget, len(item.ids) - item.fed)
        step.chunks.append((item, item.fed, count))
        budget -= count
    while budget > 0 and waiting and _has_free_slot(engine) and _fits(engine, waiting[0], budget):
        item = waiting.popleft()
        item.slot = engine.slots.free_slot()
        item.slot.seq = item                 # live while it runs: no one evicts or reuses it
        active.append(item)
        count = min(budget, len(item.ids))
        step.chunks.append((item, 0, count))
        budget -= count
    if not step.chunks:
        short_of_cells = budget == 0 or (waiting and not _fits(engine, waiting[0], budget))
        what = "KV cache cell" if short_of_cells else "sequence slot"
        raise ContextLengthError(f"every {what} is in use by running requests; retry the embedding later")
    return step


def _fits(engine, item: _Input, budget: int) -> bool:
    """Whether `item` may start in a pass with `budget` tokens to spare: any part of it
    may, except in an encoder, which reads each input whole in one pass (so it waits for
    the next pass; one longer than n_batch never fits: a typed error)."""
    if getattr(engine.forward, "causal", True):
        return True
    if len(item.ids) > engine.n_batch:
        raise ContextLengthError(f"an input of {len(item.ids)} tokens is longer than n_batch ({engine.n_batch}): "
                                 "an encoder reads each input in one batch; raise n_batch or truncate the input")
    return len(item.ids) <= budget


def _has_free_slot(engine) -> bool:
    return any(not slot.live for slot in engine.slots.slots)


def _run_pass(engine, step: _Pass, hidden: bool) -> None:
    tokens, positions, seq_ids, out_rows, owners = [], [], [], [], []
    offset = 0
    for item, start, count in step.chunks:
        engine.cache.slide(item.slot.id, start, engine.swa_margin)
        tokens.extend(item.ids[start:start + count])
        positions.append(np.arange(start, start + count))
        seq_ids.append(np.full(count, item.slot.id))
        kept = item.wanted[(item.wanted >= start) & (item.wanted < start + count)]
        owners.append((item, len(out_rows), len(kept)))
        out_rows.extend((kept - start + offset).tolist())
        offset += count
    run = engine.forward.hidden if hidden else engine.forward
    # a pass whose rows are all dropped still fills the cache; it reads one row it ignores
    out = run(np.asarray(tokens, np.int32), np.concatenate(positions), np.concatenate(seq_ids),
              np.asarray(out_rows or [0], np.int32))
    for (item, start, count), (_, first, n_kept) in zip(step.chunks, owners):
        item.rows[item.kept:item.kept + n_kept] = out[first:first + n_kept]
        item.kept += n_kept
        item.fed = start + count


def reserve_cells(engine, n_new: int) -> int:
    """Evict cached (idle) prefixes until the cache has room for `n_new` tokens, or none
    is left to evict; how many new tokens fit (at most `n_new`)."""
    try:
        engine.cache.reserve(n_new, engine.slots.evict_lru)
        return n_new
    except ContextLengthError:
        return min((group.cells.n_free for group in engine.cache.groups), default=0)


def _release(engine, item: _Input) -> None:
    if item.slot is not None:
        item.slot.seq = None
        engine.slots.evict(item.slot)
        item.slot = None


__all__ = ["DimensionsError", "POOLINGS", "QWEN3_RERANK_TEMPLATE", "classify", "embed_prompts",
           "is_embedding_model", "model_pooling", "normalized", "pool", "pooling_name", "rank_order", "rerank_prompts",
           "reserve_cells", "run_rows", "shortened", "yes_no_ids", "yes_probability"]
