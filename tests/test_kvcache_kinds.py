"""The cache kinds beside attention K/V (kvcache/cache.py): recurrent states with
checkpoints and encoder memories, their bookkeeping, and the recurrent state through
the engine on a toy hybrid model (tests/recurrent_toy.py): checkpoints at chunk and
turn ends, a second turn that resumes from one, rollback, several sequences at
once, a refused context shift, eviction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_support import drive, never_eog
from recurrent_toy import N_EMBD, ToyHybrid, f32_weight

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.gguf import GGUFFile
from pyengine.kvcache import Cache, ContextShiftError, EncoderMemory, RecurrentState
from pyengine.kvcache.recurrent import EMPTY_ROW
from pyengine.kvcache.rows import FORMATS
from pyengine.ml.context import Backend
from pyengine.ml.nn import CacheSpec, EncoderSpec, Linear, RecurrentSpec
from pyengine.runner.engine import Engine, state_rows
from pyengine.tokenizer import Tokenizer

SYNTH = Path(__file__).parent / "data" / "synth"
HYBRID = [CacheSpec(8, 8), RecurrentSpec(conv_dim=4, state_dim=6), CacheSpec(8, 8, window=4),
          RecurrentSpec(conv_dim=0, state_dim=3)]


def book(state: RecurrentState, seq: int, p0: int, n: int):
    """Allocate a batch of n tokens of one sequence from position p0."""
    return state.allocate(np.arange(p0, p0 + n, dtype=np.int32), np.full(n, seq, np.int64))


# ---- recurrent state bookkeeping -----------------------------------------------------


def test_each_step_reads_one_row_and_writes_another_and_frees_what_it_leaves():
    state = RecurrentState(HYBRID, 8)
    assert [t is None for t in state.conv] == [True, False, True, True]   # layer 3 keeps no conv window
    first = book(state, 0, 0, 5)
    assert first.read.tolist() == [EMPTY_ROW] and first.write[0] != EMPTY_ROW
    second = book(state, 0, 5, 1)
    assert second.read.tolist() == first.write.tolist() and second.write[0] != first.write[0]
    assert state.n_used == 1 and state.position(0) == 6        # the row it left is free again
    third = book(state, 0, 6, 1)
    assert third.write[0] == first.write[0]                    # and taken again
    with pytest.raises(InvalidOptionError, match="state is at position 7"):
        book(state, 0, 9, 1)


def test_a_batch_of_several_sequences_gets_their_rows_token_sequences_and_last_rows():
    state = RecurrentState(HYBRID, 8)
    book(state, 3, 0, 2)
    held = state.row_of(3)
    rows = state.allocate(np.array([2, 3, 0, 0, 1, 2], np.int32), np.array([3, 3, 5, 9, 9, 9], np.int64))
    assert rows.read.tolist() == [held, EMPTY_ROW, EMPTY_ROW]
    written = set(rows.write.tolist())
    assert len(written) == 3 and not written & {held, EMPTY_ROW}   # no row both read and written
    assert rows.token_seq.tolist() == [0, 0, 1, 2, 2, 2] and rows.seq_last.tolist() == [1, 2, 5]
    assert [state.position(s) for s in (3, 5, 9)] == [4, 1, 3]
    assert rows.table.tolist() == [[0, 2, held, rows.write[0], 2], [2, 1, EMPTY_ROW, rows.write[1], 0],
                                   [3, 3, EMPTY_ROW, rows.write[2], 0]]
    with pytest.raises(InvalidOptionError, match="side by side"):
        state.allocate(np.array([4, 1, 5], np.int32), np.array([3, 5, 3], np.int64))


def test_checkpoints_are_kept_bounded_and_resumed_from_the_nearest_one():
    state = RecurrentState(HYBRID, 16, max_checkpoints=3)
    p = 0
    for n in (4, 4, 4, 4, 2):      # prompt chunks, each end a checkpoint
        book(state, 1, p, n)
        p += n
        state.checkpoint(1)
    assert state.checkpoints(1) == [12, 16, 18]   # three at most: the oldest went first
    book(state, 1, 18, 1)
    book(state, 1, 19, 1)                         # generated tokens: no checkpoint of their own
    assert state.checkpoints(1) == [12, 16, 18] and state.position(1) == 20
    assert [state.usable_prefix(1, n) for n in (5, 11, 12, 15, 17, 19, 20, 99)] == [0, 0, 12, 12, 16, 18, 20, 20]
    state.remove(1, 17)                           # rollback: keep what holds no position >= 17
    assert state.position(1) == 16 and state.checkpoints(1) == [12, 16]
    book(state, 1, 16, 3)                         # and go on from there
    assert state.position(1) == 19
    state.remove(1)
    assert state.n_used == 0 and state.n_free == 15


def test_a_prefix_copy_takes_the_state_rows_at_that_position():
    state = RecurrentState(HYBRID, 8)
    book(state, 0, 0, 4)
    state.checkpoint(0)
    row = state.row_of(0)
    state.state[1][row] = np.arange(6)
    state.conv[1][row] = 7
    book(state, 0, 4, 2)
    state.copy_prefix(0, 5, 4)
    copy = state.row_of(5)
    assert copy not in (row, state.row_of(0)) and state.position(5) == 4
    assert state.state[1][copy].tolist() == list(range(6)) and state.conv[1][copy].tolist() == [7] * 4
    with pytest.raises(InvalidOptionError, match="no recurrent state at position 5"):
        state.copy_prefix(0, 6, 5)
    with pytest.raises(InvalidOptionError, match="must be empty"):
        state.copy_prefix(0, 5, 4)


def test_reserve_evicts_idle_sequences_then_drops_checkpoints_for_rows():
    cache = Cache.build(HYBRID, 64, state_rows=5, max_checkpoints=4)
    rec = cache.recurrent
    for p in (0, 2, 4):
        book(rec, 0, p, 2)
        rec.checkpoint(0)
    assert rec.n_free == 1
    idle = [2]
    book(rec, 2, 0, 1)
    assert rec.n_free == 0

    def evict(among=None):
        if not idle:
            return False
        cache.remove(idle.pop())
        return True

    cache.reserve(1, evict, n_seqs=2)     # the idle sequence goes, then the oldest checkpoint
    assert not idle and rec.n_free == 2 and rec.checkpoints(0) == [4, 6]
    rec.remove(0, 6)
    book(rec, 0, 6, 1)
    with pytest.raises(ContextLengthError, match="recurrent state"):
        cache.reserve(1, evict, n_seqs=4)


def test_a_cache_with_recurrent_layers_refuses_to_shift_and_counts_its_state_bytes():
    cache = Cache.build(HYBRID, 32, window_cells={4: 16}, state_rows=9)
    assert cache.attention.layer_group[1] is None and cache.attention.k[3] is None
    assert cache.recurrent.layers == [1, 3]
    with pytest.raises(ContextShiftError, match="recurrent"):
        cache.shift(0, 2, 4, rotate=None)
    state_bytes = 9 * (4 + 6 + 3) * 4
    assert cache.recurrent.nbytes == state_bytes
    assert cache.nbytes == cache.attention.nbytes + state_bytes
    cache.allocate(np.arange(3, dtype=np.int32), np.zeros(3, np.int64))
    assert cache.n_used == 2 * 3 + 1 and cache.seq_ids() == [0]
    cache.clear()
    assert cache.n_used == 0


def test_usable_prefix_of_a_hybrid_is_a_checkpoint_the_cells_also_reach():
    cache = Cache.build([CacheSpec(8, 8), RecurrentSpec(4, 4)], 32, state_rows=8)
    for p, n in ((0, 4), (4, 4), (8, 3)):
        cache.allocate(np.arange(p, p + n, dtype=np.int32), np.zeros(n, np.int64))
        cache.checkpoint(0)
    assert [cache.usable_prefix(0, n) for n in (3, 4, 7, 10, 11, 20)] == [0, 4, 4, 8, 11, 11]
    cache.attention.remove(0, 6)          # cells end at 6: the checkpoint at 8 is out of reach
    assert cache.usable_prefix(0, 11) == 4


# ---- encoder memory ------------------------------------------------------------------


def test_encoder_memory_lives_while_a_sequence_holds_it():
    layout = [CacheSpec(8, 8), EncoderSpec(k_dim=8, v_dim=4, n_rows=6)]
    cache = Cache.build(layout, 16)
    memory = cache.encoder
    assert isinstance(memory, EncoderMemory) and memory.n_rows == 6 and memory.layers == [1]
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    stored = memory.store(2, 0, [k], [v])
    assert memory.rows_of(2).tolist() == [0, 1, 2]
    back = FORMATS["f16"].decode(memory.k[1][stored.start:stored.start + 3], 8)
    np.testing.assert_array_equal(back, k.astype(np.float16).astype(np.float32))
    later = memory.store(2, 5, [k[:2]], [v[:2]])   # an image later in the prompt
    mask = np.zeros((4, 6), np.float32)
    memory.fill_mask(mask, np.array([0, 4, 5, 0], np.int32), np.array([2, 2, 2, 7], np.int64))
    assert (mask == 0).tolist() == [[True] * 3 + [False] * 3, [True] * 3 + [False] * 3,
                                    [True] * 5 + [False], [False] * 6]
    cache.copy_prefix(2, 7, 5)                     # shares the memory attached before position 5
    assert memory.rows_of(7).tolist() == [0, 1, 2]
    cache.remove(2, 5)                             # rolling back past the later image frees it
    assert later not in memory.memories and memory.n_used == 3
    cache.remove(2)
    assert memory.n_used == 3                      # sequence 7 still holds the first
    cache.remove(7)
    assert memory.n_used == 0 and cache.n_used == 0
    memory.store(1, 0, [np.zeros((6, 8), np.float32)], [np.zeros((6, 4), np.float32)])
    with pytest.raises(ContextLengthError, match="no run of 1 free rows"):
        memory.store(3, 0, [k[:1]], [v[:1]])


# ---- through the engine --------------------------------------------------------------


@pytest.fixture(scope="module")
def parts():
    return ToyHybrid(), Tokenizer.from_gguf(GGUFFile(SYNTH / "llama-f16.gguf")), Backend(1)


@pytest.fixture
def make(parts):
    engines = []

    def build(**kw) -> Engine:
        model, tok, backend = parts
        engine = Engine(model, tok, backend, **{"n_ctx": 64, "n_batch": 4, "n_parallel": 2,
                                                "background": False, **kw})
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.close()


def run(engine: Engine, prompt: list[int], max_tokens: int = 6, **kw):
    handle = engine.submit(prompt, never_eog(engine), max_tokens=max_tokens, **kw)
    drive(engine)
    return handle.result()


PROMPT = [3, 5, 7, 9, 11, 13, 15, 17, 19, 21]


def test_the_toy_state_is_the_running_sum_and_chunking_does_not_change_it(make, parts):
    model = parts[0]
    engine = make()
    first = run(engine, PROMPT)
    rec = engine.cache.recurrent
    row = rec.row_of(0)
    fed = PROMPT + first.tokens[:-1]
    np.testing.assert_array_equal(rec.state[1][row], model.reference_state(fed))
    np.testing.assert_array_equal(rec.conv[1][row], model.emb[fed[-1]])
    assert rec.checkpoints(0) == [4, 8, 10, len(fed)]   # chunk ends, the prompt's end, the turn's end
    assert run(make(n_batch=64), PROMPT, cache_prompt=False).tokens == first.tokens


def test_a_second_turn_resumes_from_the_checkpoint_and_equals_a_cold_run(make):
    engine = make()
    first = run(engine, PROMPT)
    follow_up = PROMPT + first.tokens + [23, 25]
    before = engine.prompt_tokens_computed
    second = run(engine, follow_up)
    assert second.cached_tokens == len(PROMPT) + len(first.tokens) - 1   # the last token was never fed
    assert engine.prompt_tokens_computed - before == 3
    assert second.tokens == run(make(n_batch=64), follow_up, cache_prompt=False).tokens


def test_a_prompt_that_diverges_rolls_back_to_the_nearest_checkpoint(make):
    engine = make()
    run(engine, PROMPT)
    changed = PROMPT[:6] + [31, 33, 35]          # shares 6 tokens; checkpoints at 4, 8, 10, ...
    before = engine.prompt_tokens_computed
    result = run(engine, changed)
    assert result.cached_tokens == 4 and engine.prompt_tokens_computed - before == len(changed) - 4
    assert result.tokens == run(make(), changed, cache_prompt=False).tokens


def test_four_sequences_at_once_give_their_alone_tokens(make):
    prompts = [list(np.random.default_rng(s).integers(1, 64, 5 + 3 * s)) for s in range(4)]
    prompts = [[int(t) for t in p] for p in prompts]
    alone = [run(make(), p, max_tokens=8, cache_prompt=False).tokens for p in prompts]
    engine = make(n_parallel=4, n_batch=7)
    opts = never_eog(engine)
    handles = [engine.submit(p, opts, max_tokens=8) for p in prompts]
    drive(engine)
    assert [h.result().tokens for h in handles] == alone
    shared = [engine.submit(prompts[0] + [40 + i], opts, max_tokens=4) for i in range(3)]   # live prefix copies
    drive(engine)
    assert [h.result().tokens for h in shared] == \
        [run(make(), prompts[0] + [40 + i], max_tokens=4, cache_prompt=False).tokens for i in range(3)]


def test_a_twin_with_the_same_prompt_starts_from_its_state_at_the_prompts_end(make):
    engine = make(n_parallel=2)
    opts = never_eog(engine)
    first = engine.submit(PROMPT, opts, max_tokens=5)
    engine.step()                                # first is computing the prompt
    twin = engine.submit(PROMPT, opts, max_tokens=5)
    drive(engine)
    result = twin.result()
    assert result.cached_tokens == len(PROMPT)     # nothing of the prompt computed again
    assert engine.prompt_tokens_computed == len(PROMPT)
    assert result.tokens == first.result().tokens


def test_an_embedding_runs_in_a_slot_of_its_own_and_gives_its_rows_back(make):
    from pyengine.embedding import embed_prompts

    engine = make()
    run(engine, PROMPT)
    held = engine.cache.n_used
    pooled = embed_prompts(engine, [PROMPT[:7]], "mean", normalize=False)[0]
    assert pooled.shape == (N_EMBD,) and engine.cache.n_used == held
    again = embed_prompts(engine, [PROMPT[:7]], "mean", normalize=False)[0]
    np.testing.assert_array_equal(pooled, again)


def test_a_full_context_is_refused_a_shift_with_a_typed_error(make):
    engine = make(n_ctx=16)
    handle = engine.submit(PROMPT, never_eog(engine), max_tokens=20)
    drive(engine)
    with pytest.raises(ContextShiftError, match="cannot shift"):
        handle.result()
    assert run(engine, PROMPT, max_tokens=20, shift=False).finish_reason == "length"


def test_idle_states_are_evicted_for_new_sequences_and_nothing_leaks(make):
    engine = make(n_parallel=1, state_checkpoints=2)
    assert engine.cache.recurrent.n_rows == state_rows(1, 2)
    for s in range(12):
        run(engine, [int(t) for t in np.random.default_rng(100 + s).integers(1, 64, 9)], max_tokens=3)
        assert engine.cache.recurrent.n_free >= 0
    assert len(engine.cache.recurrent.checkpoints(0)) <= 2
    engine.drop_cache()
    assert engine.cache.n_used == 0 and engine.stats()["cells_used"] == 0


def test_the_engine_cache_counts_state_and_checkpoint_rows(make):
    engine = make(n_parallel=3, state_checkpoints=5)
    rows = state_rows(3, 5)
    assert rows == 1 + 4 * 7
    assert engine.cache.recurrent.nbytes == rows * 2 * N_EMBD * 4
    assert engine.cache.nbytes == engine.cache.attention.nbytes + engine.cache.recurrent.nbytes


# ---- the server's estimate -----------------------------------------------------------


def test_the_servers_memory_estimate_counts_states_and_checkpoints_of_recurrent_layers():
    from pyengine.server import models

    hybrid = {"a.block_count": 4, "a.full_attention_interval": 4, "a.attention.head_count": 4,
              "a.attention.head_count_kv": 2, "a.embedding_length": 64, "a.attention.key_length": 16,
              "a.attention.value_length": 16, "a.ssm.state_size": 8, "a.ssm.inner_size": 32,
              "a.ssm.conv_kernel": 4, "a.ssm.group_count": 2}
    assert models._recurrent_layers(hybrid, "a", 4) == {0, 1, 2}
    per_cell = models._kv_bytes_per_cell(hybrid, "a")
    assert per_cell == 2 * (16 + 16) * 2                           # the attention layer alone
    row = models._state_bytes_per_row(hybrid, "a")
    assert row == 3 * (3 * (32 + 2 * 2 * 8) + 8 * 32) * 4
    limits = models.ContextLimits(None, 128, per_cell, row)
    assert limits.kv_bytes(128, 2) == per_cell * 128 * 2 + row * state_rows(2, 4)
    mamba = {"m.block_count": 2, "m.attention.head_count": 0, "m.embedding_length": 16,
             "m.ssm.state_size": 4, "m.ssm.inner_size": 32, "m.ssm.conv_kernel": 4}
    assert models._kv_bytes_per_cell(mamba, "m") == 0
    assert models._state_bytes_per_row(mamba, "m") == 2 * (3 * (32 + 2 * 4) + 4 * 32) * 4
    dense = {"d.block_count": 2, "d.attention.head_count": 2, "d.embedding_length": 16}
    assert models._state_bytes_per_row(dense, "d") == 0 and models._kv_bytes_per_cell(dense, "d") == 2 * 32 * 2


class _CrossAttender:
    """Layer 0 attends over the sequence's encoder memory: logits = out . attn(x, memory)."""

    def __init__(self) -> None:

        rng = np.random.default_rng(5)
        self.cfg = ToyHybrid().cfg
        self.emb = rng.standard_normal((64, N_EMBD)).astype(np.float32)
        self.embedding = f32_weight("token_embd", self.emb)
        self.out = rng.standard_normal((64, N_EMBD)).astype(np.float32)
        self.output = Linear(f32_weight("output", self.out))

    def cache_layout(self) -> list:
        return [EncoderSpec(k_dim=N_EMBD, v_dim=N_EMBD, n_rows=6)]

    def forward(self, ctx, batch):
        x = ctx.get_rows(ctx.weight(self.embedding), batch.tokens)
        memory = batch.encoder_inputs(0)
        q = ctx.reshape(x, (N_EMBD, 1, batch.n_tokens))
        y = ctx.attn(q, memory.k, memory.v, memory.mask, memory.kv_len, n_head_kv=1, scale=0.5)
        return ctx.mul_mat(ctx.weight(self.output.weight), ctx.get_rows(y, batch.out_ids))


def test_the_graph_attends_each_sequences_own_encoder_memory():
    from pyengine.runner.forward import Forward

    model = _CrossAttender()
    cache = Cache.build(model.cache_layout(), 1)
    assert cache.attention is None and cache.recurrent is None
    fw = Forward(model, Backend(1), cache)
    rng = np.random.default_rng(1)
    memories = {}
    for sid, n in ((0, 2), (3, 4)):
        k, v = (rng.standard_normal((n, N_EMBD)).astype(np.float16).astype(np.float32) for _ in range(2))
        cache.encoder.store(sid, 0, [k], [v])
        memories[sid] = (k, v)
    tokens, seq_ids = np.array([5, 9, 11], np.int32), np.array([0, 3, 3], np.int64)
    logits = fw(tokens, np.array([0, 0, 1], np.int32), seq_ids, np.arange(3, dtype=np.int32))
    for t, (token, sid) in enumerate(zip(tokens, seq_ids)):
        k, v = memories[int(sid)]
        scores = k @ model.emb[token] * 0.5
        weights = np.exp(scores - scores.max())
        expected = model.out @ (weights / weights.sum() @ v)
        np.testing.assert_allclose(logits[t], expected, rtol=1e-3, atol=1e-3)
    cache.remove(0)
    assert cache.encoder.rows_of(3).tolist() == [2, 3, 4, 5] and cache.n_used == 4


def test_a_live_prefix_copy_finds_a_state_row_when_idle_sequences_hold_them_all(make):
    engine = make(n_parallel=2, state_checkpoints=2)
    for s in range(3):                           # idle sequences with states to evict
        run(engine, [int(t) for t in np.random.default_rng(200 + s).integers(1, 64, 6)], max_tokens=2)
    opts = never_eog(engine)
    first = engine.submit(PROMPT, opts, max_tokens=30)
    for _ in range(4):
        engine.step()                            # PROMPT in and decoding: live, checkpoints at 8 and 10
    rec = engine.cache.recurrent
    taken = [rec._free.pop() for _ in range(rec.n_free)]   # as if idle sequences held every free row
    second = engine.submit(PROMPT[:8] + [40], opts, max_tokens=4)
    drive(engine)
    assert second.result().cached_tokens == 8
    assert first.result().finish_reason == "length"
    rec._free.extend(taken)


class _ShortConv:
    """One recurrent layer through the native ssm_conv op (kernel 3): the cache's conv rows
    and seqs table are what the op reads and writes."""

    K = 3

    def __init__(self) -> None:
        rng = np.random.default_rng(9)
        self.cfg = ToyHybrid().cfg
        self.emb = rng.integers(-2, 3, (64, N_EMBD)).astype(np.float32)
        self.w = rng.integers(-2, 3, (N_EMBD, self.K)).astype(np.float32)     # ggml [K, d]
        self.embedding = f32_weight("token_embd", self.emb)
        self.conv = f32_weight("conv1d", self.w)
        self.output = Linear(f32_weight("output", rng.integers(-2, 3, (64, N_EMBD))))

    def cache_layout(self) -> list:
        return [RecurrentSpec(conv_dim=(self.K - 1) * N_EMBD, state_dim=0)]

    def forward(self, ctx, batch):
        rec = batch.recurrent_inputs(0)
        x = ctx.get_rows(ctx.weight(self.embedding), batch.tokens)
        y = ctx.ssm_conv(x, ctx.weight(self.conv), rec.conv, rec.seqs)
        return ctx.mul_mat(ctx.weight(self.output.weight), ctx.get_rows(y, batch.out_ids))

    def reference_logits(self, tokens: list[int]) -> np.ndarray:
        xx = np.concatenate([np.zeros((self.K - 1, N_EMBD), np.float32), self.emb[tokens]])
        y = np.stack([(self.w.T * xx[t:t + self.K]).sum(axis=0) for t in range(len(tokens))])
        return y @ self.output.weight.data.T


def test_the_native_short_conv_runs_on_the_caches_rows_and_resumes_from_a_checkpoint(parts):
    model = _ShortConv()
    engine = Engine(model, parts[1], parts[2], n_ctx=64, n_batch=3, n_parallel=2, background=False)
    try:
        scored = run(engine, PROMPT, max_tokens=0, cache_prompt=False, all_logits=True)
        np.testing.assert_array_equal(scored.logits, model.reference_logits(PROMPT))
        first = run(engine, PROMPT, max_tokens=4)
        follow_up = PROMPT + first.tokens + [23, 25]
        before = engine.prompt_tokens_computed
        second = run(engine, follow_up, max_tokens=4)
        assert engine.prompt_tokens_computed - before == 3
        cold = run(engine, follow_up, max_tokens=4, cache_prompt=False, all_logits=True)
        assert second.tokens == cold.tokens
        np.testing.assert_array_equal(cold.logits, model.reference_logits(follow_up))
    finally:
        engine.close()
