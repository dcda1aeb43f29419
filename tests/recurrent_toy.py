"""A toy hybrid model for the cache kinds: layer 0 attends (a K/V cache), layer 1 is
recurrent with a running sum for its state, so that what a token sees depends on
every token before it through a state of fixed size (kvcache/recurrent.py).

Per token t of a sequence: h_t = S + sum of the embeddings of the sequence's tokens
up to t, where S is the state the batch read (the sum over the tokens before the
batch); the state written is h at the sequence's last token, and its conv row keeps
that token's embedding (a convolution window of one token).  The embeddings are
small integers, so every sum is exact whatever the batch's shape: a wrong state
(a checkpoint resumed at the wrong position, a row read that another sequence
wrote) changes the logits, never the rounding.

The graph uses existing ops only: a one-hot product sums each sequence's tokens
(a [T, T] same-sequence, causal 0/1 matrix built from the batch's token_seq), and
get_rows / set_rows read and write the state rows the cache gave the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyengine.kvcache import MAX_SEQUENCES
from pyengine.ml import nn
from pyengine.ml.context import F32, Context, Tensor

N_EMBD = 8
N_VOCAB = 64


@dataclass(frozen=True)
class ToyConfig:
    n_vocab: int = N_VOCAB
    n_embd: int = N_EMBD
    head_dim: int = N_EMBD


def f32_weight(name: str, values: np.ndarray) -> nn.Weight:
    """A float32 weight of `values` (numpy order: rows are the GGML second dimension)."""
    values = np.ascontiguousarray(values, np.float32)
    return nn.Weight(name, F32, tuple(reversed(values.shape)), values)


class ToyHybrid:
    """Attention then a running-sum recurrent layer, then the output projection."""

    def __init__(self, seed: int = 0, attention: bool = True) -> None:
        rng = np.random.default_rng(seed)
        self.cfg = ToyConfig()
        self.attention = attention
        emb = rng.integers(-2, 3, (N_VOCAB, N_EMBD)).astype(np.float32)    # row v: token v's embedding
        self.emb = emb
        self.embedding = f32_weight("token_embd", emb)
        self.output = nn.Linear(f32_weight("output", rng.integers(-2, 3, (N_VOCAB, N_EMBD))))
        self._emb_t = np.ascontiguousarray(emb.T)                          # ggml [n_vocab, n_embd]
        self._seq_eye = np.eye(MAX_SEQUENCES, dtype=np.float32)
        self._vocab_eye = np.eye(N_VOCAB, dtype=np.float32)
        self._causal: dict[int, np.ndarray] = {}                           # per batch size, kept for its graphs

    def cache_layout(self) -> list:
        attn = [nn.CacheSpec(k_dim=N_EMBD, v_dim=N_EMBD)] if self.attention else []
        return attn + [nn.RecurrentSpec(conv_dim=N_EMBD, state_dim=N_EMBD)]

    def forward(self, ctx: Context, batch) -> Tensor:
        x = ctx.get_rows(ctx.weight(self.embedding), batch.tokens)                     # [n_embd, T]
        y = self._running_sum(ctx, batch, len(self.cache_layout()) - 1)
        if self.attention:
            q = ctx.reshape(x, (N_EMBD, 1, batch.n_tokens))
            y = ctx.add(y, nn.attention(ctx, batch, 0, q, x, x, n_head_kv=1, scale=0.25))
        y = ctx.get_rows(y, batch.out_ids)
        return ctx.mul_mat(ctx.weight(self.output.weight), y)

    def _running_sum(self, ctx: Context, batch, layer: int) -> Tensor:
        rec = batch.recurrent_inputs(layer)
        n = batch.n_tokens
        causal = self._causal.setdefault(n, np.tril(np.ones((n, n), np.float32)))
        one_hot = ctx.get_rows(ctx.input(self._seq_eye, "seq_eye"), rec.token_seq)        # [64, T]
        same = ctx.mul(ctx.mul_mat(one_hot, one_hot), ctx.input(causal, f"causal.{n}"))  # [T, T]: u <= t, same seq
        tokens_hot = ctx.get_rows(ctx.input(self._vocab_eye, "vocab_eye"), batch.tokens)  # [n_vocab, T]
        x_t = ctx.mul_mat(tokens_hot, ctx.input(self._emb_t, "emb_t"))                  # [T, n_embd]: x transposed
        sums = ctx.mul_mat(x_t, same)                                                    # [n_embd, T]
        start = ctx.get_rows(rec.state, rec.read)                                        # [n_embd, n_seqs]
        h = ctx.add(ctx.get_rows(start, rec.token_seq), sums)
        ctx.set_rows(rec.state, ctx.get_rows(h, rec.seq_last), rec.write)
        x_last = ctx.get_rows(ctx.get_rows(ctx.weight(self.embedding), batch.tokens), rec.seq_last)
        ctx.set_rows(rec.conv, x_last, rec.write)
        return h

    def shift_keys(self, ctx, heads, positions, layer, n_ctx_seq=None):
        raise AssertionError("a model with recurrent layers never shifts")

    def reference_state(self, tokens: list[int]) -> np.ndarray:
        """The state after `tokens`: the sum of their embeddings."""
        return self.emb[np.asarray(tokens, np.int64)].sum(axis=0) if tokens else np.zeros(N_EMBD, np.float32)
