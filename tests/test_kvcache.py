"""KV cache bookkeeping: cells shared by sequences, the order rule, window groups,
compaction and shifts moving the right rows, key re-rotation."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.gguf import GGUFFile
from pyengine.kvcache import KeyRotator, KVCache
from pyengine.kvcache.cells import CellTable, seq_bit
from pyengine.ml.context import Backend
from pyengine.ml.nn import CacheSpec
from pyengine.models import load_model
from pyengine.runner.forward import Forward

SYNTH = Path(__file__).parent / "data" / "synth"


def alloc(cache: KVCache, seq: int, positions) -> list[np.ndarray]:
    positions = np.asarray(positions)
    return cache.allocate(positions, np.full(len(positions), seq))


def full_layout(n_layer: int = 2, dim: int = 4) -> list[CacheSpec]:
    return [CacheSpec(dim, dim, 0)] * n_layer


# ---- memory ------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_type, n_cells", [("f16", 8), ("f16", 4096), ("q8_0", 4096)])
def test_rows_of_every_layer_are_zeroed_tables_of_one_block_that_do_not_overlap(kv_type, n_cells):
    """The K and V tables of all layers (a window group's smaller ones too) are carved
    from one block (in huge pages where Linux gives them: hugepages.py), each zeroed, on
    its own cache line, and writing one leaves the others as they were."""
    layout = [CacheSpec(64, 64, 0), CacheSpec(64, 32, 16)] * 3
    cache = KVCache(layout, n_cells, window_cells={16: 32}, kv_type=kv_type)
    tables = cache.k + cache.v
    assert all(t.base is tables[0].base for t in tables)
    assert all(not t.any() and t.ctypes.data % 64 == 0 for t in tables)
    spans = sorted((t.ctypes.data, t.ctypes.data + t.nbytes) for t in tables)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    for i, t in enumerate(tables):
        t[...] = i + 1
    assert all((t == i + 1).all() for i, t in enumerate(tables))
    assert [t.shape[0] for t in cache.k] == [n_cells, min(n_cells, 32)] * 3


def test_huge_page_zeros_are_zero_and_writable():
    from pyengine import hugepages

    for nbytes in (100, hugepages.HUGE_PAGE + 100):
        block = hugepages.zeros(nbytes)
        assert block.dtype == np.uint8 and block.size == nbytes and not block.any() and block.ctypes.data % 64 == 0
        block[-1] = 7
        assert block[-1] == 7


def resident_bytes(block: np.ndarray) -> int:
    """Bytes of the whole pages inside `block` that are in memory (Linux's mincore)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = -(-block.ctypes.data // page) * page
    n_pages = (block.ctypes.data + block.nbytes - start) // page
    flags = (ctypes.c_ubyte * n_pages)()
    mincore = ctypes.CDLL(None, use_errno=True).mincore
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert mincore(start, n_pages * page, flags) == 0, ctypes.get_errno()
    return sum(f & 1 for f in flags) * page


def linux_at_least(major: int, minor: int) -> bool:
    import platform

    if platform.system() != "Linux":
        return False
    return tuple(int(v) for v in platform.release().split(".")[:2]) >= (major, minor)


def test_prefault_faults_the_memory_in_a_piece_at_a_time_and_keeps_what_it_holds():
    """Each step faults in one 2 MiB piece (Linux 5.14's MADV_POPULATE_WRITE), leaving
    what the memory holds; elsewhere there is nothing to step."""
    from pyengine import hugepages

    block = hugepages.zeros(4 * hugepages.HUGE_PAGE)
    block[5] = 3
    prefault = hugepages.Prefault([block[: 3 * hugepages.HUGE_PAGE], block[3 * hugepages.HUGE_PAGE:]])
    if not linux_at_least(5, 14):
        while prefault.step():
            pass
        assert prefault.done
        return
    steps = [prefault.step(), prefault.step()]
    assert resident_bytes(block) == 2 * hugepages.HUGE_PAGE
    while steps[-1]:
        steps.append(prefault.step())
    assert steps == [True, True, True, False] and prefault.done and not prefault.step()
    assert resident_bytes(block) == block.nbytes
    assert block[5] == 3 and np.count_nonzero(block) == 1


def test_a_cache_larger_than_half_the_available_memory_is_left_to_fault_lazily(monkeypatch):
    from pyengine import hugepages

    block = hugepages.zeros(4 * hugepages.HUGE_PAGE)
    monkeypatch.setattr(hugepages, "available_memory", lambda: 2 * block.nbytes - 1)
    prefault = hugepages.Prefault([block])
    assert prefault.done and not prefault.step()
    assert resident_bytes(block) == 0


def test_an_idle_engine_faults_its_cache_in(smollm2_path):
    """The engine steps the cache's Prefault while it has no work: a server's cache is
    resident before requests need it (and a request made meanwhile is served)."""
    from pyengine.api import LLM

    with LLM(str(smollm2_path), n_ctx=2048, n_parallel=2) as llm:
        cache = llm.engine.cache
        assert llm.generate("The capital of France is", max_tokens=4, temperature=0)
        deadline = time.monotonic() + 60
        while not cache.prefault.done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cache.prefault.done
        if linux_at_least(5, 14):
            assert all(resident_bytes(t) == t.nbytes for t in (cache.k[0], cache.v[-1]))


# ---- cells and sequences ---------------------------------------------------------------


def test_decode_steps_take_the_cells_the_general_plan_gives():
    """A decode step (one token of each of a few sequences) claims its cells on Python
    ints (plan_decode, record_decode); step after step, with sequences ending and
    starting among the others, it takes the cells plan() would and leaves the table as
    record() would, or declines (None) and leaves the step to plan()."""
    rng = np.random.default_rng(4)
    fast, slow = CellTable(48), CellTable(48)
    next_pos: dict[int, int] = {}
    taken_fast = 0
    for step in range(400):
        ids = rng.choice(6, size=int(rng.integers(1, 5)), replace=False).tolist()
        positions = [next_pos.get(sid, 0) for sid in ids]
        want = slow.plan(np.array(positions), np.array(ids))
        if want is None:   # full: both start over
            for table in (fast, slow):
                table.clear()
            next_pos.clear()
            continue
        got = fast.plan_decode(ids, positions)
        if got is None:
            fast.record(fast.plan(np.array(positions), np.array(ids)), np.array(positions), np.array(ids))
        else:
            assert got == want.tolist(), step
            fast.record_decode(got, ids, positions)
            taken_fast += 1
        slow.record(want, np.array(positions), np.array(ids))
        for sid, position in zip(ids, positions):
            next_pos[sid] = position + 1
        if rng.random() < 0.1:   # a sequence ends
            sid = int(rng.integers(6))
            for table in (fast, slow):
                table.remove(sid)
            next_pos.pop(sid, None)
        assert np.array_equal(fast.pos, slow.pos) and np.array_equal(fast.seq, slow.seq), step
        assert fast.n_kv == slow.n_kv and fast.n_used == slow.n_used
    assert taken_fast > 200


def test_sequences_share_a_cache_and_removal_frees_cells():
    cache = KVCache(full_layout(), 16)
    a = alloc(cache, 0, range(4))[0]
    b = alloc(cache, 5, range(3))[0]
    assert list(a) == [0, 1, 2, 3] and list(b) == [4, 5, 6]
    assert cache.n_used == 7 and cache.seq_ids() == [0, 5]
    cache.remove(0, 2)
    assert list(cache.seq_positions(0)) == [0, 1] and cache.n_used == 5
    cache.remove(5)
    assert cache.seq_ids() == [0] and cache.n_used == 2
    cache.clear()
    assert cache.n_used == 0


def test_a_sequence_never_takes_a_cell_below_its_last_one():
    cache = KVCache(full_layout(), 16)
    alloc(cache, 0, range(4))       # cells 0-3
    alloc(cache, 1, range(2))       # cells 4-5
    cache.remove(0)                 # 0-3 free
    assert list(alloc(cache, 1, [2])[0]) == [6]      # above its own cells, not the hole
    assert list(alloc(cache, 2, [0, 1])[0]) == [0, 1]  # a new sequence fills the hole


def test_compaction_keeps_every_rows_data_and_order():
    cache = KVCache(full_layout(1, 2), 8)
    alloc(cache, 0, range(3))
    alloc(cache, 1, range(5))
    for cell in range(8):   # tag each cell's K row with (sequence, position)
        cache.k[0][cell] = np.array([cache.groups[0].cells.seq[cell], cache.groups[0].cells.pos[cell]],
                                    np.float16).view(np.uint16)
    cache.remove(0)
    slots = alloc(cache, 1, [5, 6])[0]   # no free cell above seq 1's last: compacts first
    assert list(slots) == [5, 6]
    cells = cache.groups[0].cells
    assert list(cells.positions_of(1)) == list(range(7))
    tags = cache.k[0][:5].view(np.float16).astype(int)
    assert tags[:, 1].tolist() == [0, 1, 2, 3, 4]


def test_sequence_ids_are_validated_and_64_fit():
    cache = KVCache(full_layout(), 128)
    for seq in range(64):
        alloc(cache, seq, [0])
    assert len(cache.seq_ids()) == 64
    for bad in (64, -1):
        with pytest.raises(InvalidOptionError, match="0..63"):
            alloc(cache, bad, [1])
    with pytest.raises(InvalidOptionError):
        cache.remove(99)


def test_positions_must_follow_the_cached_ones():
    cache = KVCache(full_layout(), 8)
    alloc(cache, 0, [0, 1, 2])
    with pytest.raises(InvalidOptionError, match="not after"):
        alloc(cache, 0, [1])
    with pytest.raises(InvalidOptionError, match="increase"):
        alloc(cache, 1, [3, 2])


def test_full_cache_is_a_context_error():
    cache = KVCache(full_layout(), 4)
    alloc(cache, 0, range(3))
    with pytest.raises(ContextLengthError, match="full"):
        alloc(cache, 1, range(2))


def test_kv_types():
    assert KVCache(full_layout(1, 64), 4, kv_type="Q8_0").kv_type == "q8_0"
    with pytest.raises(InvalidOptionError, match="blocks of 32 values.*is 4"):
        KVCache(full_layout(), 4, kv_type="q8_0")   # rows of 4 values are not whole Q8_0 blocks
    with pytest.raises(InvalidOptionError, match="kv_type.*'f8'"):
        KVCache(full_layout(), 4, kv_type="f8")
    with pytest.raises(InvalidOptionError):
        KVCache(full_layout(), 0)


def test_masks_follow_sequences_positions_and_windows():
    cache = KVCache(full_layout(), 8)
    alloc(cache, 0, range(3))
    cache.copy_prefix(0, 1, 2)          # seq 1 shares positions 0-1
    alloc(cache, 1, [2, 3])
    mask = np.zeros((2, 8), np.float32)
    table = cache.groups[0].cells
    table.fill_mask(mask, np.array([3, 3]), np.array([1, 0]), table.n_kv)
    assert (mask[0, :5] == 0).tolist() == [True, True, False, True, True]
    assert (mask[1, :5] == 0).tolist() == [True, True, True, False, False]
    table.fill_mask(mask, np.array([3]), np.array([1]), table.n_kv, window=2)
    assert (mask[0, :5] == 0).tolist() == [False, False, False, True, True]


@pytest.mark.parametrize("window", [0, 1, 5])
def test_masks_equal_the_rule_cell_by_cell(window):
    """Random cell tables (shared, free and reused cells), tokens of several sequences at
    several positions: every mask entry follows the rule, and cells past n_kv and rows
    past the batch are left alone."""
    rng = np.random.default_rng(window)
    for _ in range(20):
        table = CellTable(40)
        table.seq[:] = rng.integers(0, 16, 40).astype(np.uint64)   # sequences 0-3, some cells shared or free
        table.pos[:] = rng.integers(0, 30, 40).astype(np.int32)
        n_kv, n_tok = int(rng.integers(0, 41)), int(rng.integers(1, 6))
        positions, seq_ids = rng.integers(0, 35, n_tok), rng.integers(0, 4, n_tok)
        mask = np.full((8, 40), 7.0, np.float32)
        table.fill_mask(mask, positions, seq_ids, n_kv, window)
        for t in range(n_tok):
            for c in range(n_kv):
                sees = bool(int(table.seq[c]) >> int(seq_ids[t]) & 1) and table.pos[c] <= positions[t] \
                    and (window == 0 or positions[t] - table.pos[c] < window)
                assert mask[t, c] == (0.0 if sees else -np.inf), (t, c)
        assert (mask[:n_tok, n_kv:] == 7.0).all() and (mask[n_tok:] == 7.0).all()
    with pytest.raises(ValueError, match="n_kv"):
        table.fill_mask(np.zeros((2, 40), np.float32), np.array([1]), np.array([0]), 41)
    with pytest.raises(ValueError, match="mask row per token"):
        table.fill_mask(np.zeros((1, 40), np.float32), np.array([1, 2]), np.array([0, 0]), 4)


def test_shared_prefix_cells_stay_until_the_last_sequence_leaves():
    cache = KVCache(full_layout(), 16)
    alloc(cache, 0, range(6))
    cache.copy_prefix(0, 1, 4)
    assert cache.n_used == 6
    cache.remove(0)
    assert cache.n_used == 4 and list(cache.seq_positions(1)) == [0, 1, 2, 3]
    with pytest.raises(InvalidOptionError, match="empty"):
        cache.copy_prefix(1, 1, 2)
    cache.remove(1)
    assert cache.n_used == 0


# ---- window groups ---------------------------------------------------------------------


def test_window_layers_get_their_own_smaller_group():
    layout = [CacheSpec(4, 4, 0), CacheSpec(4, 4, 8), CacheSpec(4, 4, 0), CacheSpec(4, 4, 8)]
    cache = KVCache(layout, 64, window_cells={8: 12})
    assert [g.n_cells for g in cache.groups] == [64, 12]
    assert cache.groups[1].layers == [1, 3] and cache.k[1].shape == (12, 4)
    for start in range(0, 40, 4):   # a long sequence through a 12-cell ring
        alloc(cache, 0, range(start, start + 4))
        cache.slide(0, start + 4, margin=0)
        held = cache.groups[1].cells.positions_of(0)
        assert held.size <= 8 and held[-1] == start + 3
    assert cache.groups[0].cells.n_used == 40


def test_usable_prefix_needs_every_group():
    layout = [CacheSpec(4, 4, 0), CacheSpec(4, 4, 4)]
    cache = KVCache(layout, 64, window_cells={4: 64})
    alloc(cache, 0, range(20))
    assert cache.usable_prefix(0, 20) == 20 and cache.usable_prefix(0, 7) == 7
    cache.slide(0, 20, margin=2)          # window group keeps positions 15..19
    assert list(cache.groups[1].cells.positions_of(0)) == [15, 16, 17, 18, 19]
    assert cache.usable_prefix(0, 20) == 20   # continuing at 20 needs 17..19
    assert cache.usable_prefix(0, 18) == 18   # at 18 needs 15..17
    assert cache.usable_prefix(0, 17) == 0    # at 17 would need 14
    assert cache.usable_prefix(3, 10) == 0


# ---- edits under random operations ----------------------------------------------------


@pytest.mark.parametrize("seed", (7, 11, 12))
def test_random_edits_keep_order_and_data(seed):
    """Allocate, remove (tails and low ends), share, shift and compact at random; every
    (sequence, position) must keep its row, every sequence its cells in position order,
    and the table's cached last cell of each sequence must be its highest."""
    rng = np.random.default_rng(seed)
    cache = KVCache(full_layout(1, 1), 48)
    shadow: dict[int, dict[int, float]] = {}   # seq -> pos -> tag in its K row
    tag = 0.0

    def identity(layers, rows, delta):
        return rows

    for _ in range(400):
        op = rng.integers(5)
        seq = int(rng.integers(6))
        mine = shadow.setdefault(seq, {})
        if op <= 1 and cache.groups[0].cells.n_free >= 3:
            start = max(mine) + 1 if mine else 0
            count = int(rng.integers(1, 4))   # one token takes the decode step's shortcut
            slots = alloc(cache, seq, range(start, start + count))[0]
            for p, cell in zip(range(start, start + count), slots):
                tag += 1
                cache.k[0][cell] = np.float16(tag).view(np.uint16)
                mine[p] = tag
        elif op == 2 and mine:
            cut = int(rng.integers(max(mine) + 1))
            p0, p1 = (cut, None) if rng.integers(2) else (0, cut)   # a tail, or a window's low end
            cache.remove(seq, p0, p1)
            for p in [p for p in mine if p >= p0 and (p1 is None or p < p1)]:
                del mine[p]
        elif op == 3 and mine:
            dst = int(rng.integers(6))
            if dst != seq and not shadow.get(dst):
                n = int(rng.integers(1, max(mine) + 2))
                cache.copy_prefix(seq, dst, n)
                shadow[dst] = {p: t for p, t in mine.items() if p < n}
        elif op == 4 and len(mine) > 4 and cache.groups[0].cells.n_free >= len(mine):
            keep, drop = 1, 2
            cache.shift(seq, keep, drop, identity)
            shadow[seq] = {(p if p < keep else p - drop): t for p, t in mine.items()
                           if p < keep or p >= keep + drop}
            # a shift unshares the moved cells: their copies get tags of their own
            others = {t for s, held in shadow.items() if s != seq for t in held.values()}
            cells = cache.groups[0].cells
            for p, cell in zip(sorted(shadow[seq]), cells.cells_of(seq)):
                if shadow[seq][p] in others and cells.seq[cell] == seq_bit(seq):
                    tag += 1
                    cache.k[0][cell] = np.float16(tag).view(np.uint16)
                    shadow[seq][p] = tag
        if rng.integers(10) == 0:
            cache.compact()
        cells = cache.groups[0].cells
        for s, held in shadow.items():
            idx = cells.cells_of(s)
            assert list(cells.pos[idx]) == sorted(held), (s, list(cells.pos[idx]), sorted(held))
            tags = cache.k[0][idx, 0].view(np.float16).astype(float)
            assert tags.tolist() == [held[p] for p in sorted(held)]
            assert cells.last_cell(s) == (int(idx[-1]) if idx.size else -1)
        assert cells.n_used == len({t for held in shadow.values() for t in held.values()})


# ---- shift re-rotation -------------------------------------------------------------------


def test_shift_rerotates_keys_like_a_fresh_run():
    """Layer 0's keys depend only on the token and its position, so after a shift by -d
    they must equal the keys of the same tokens run at the new positions."""
    model = load_model(GGUFFile(SYNTH / "llama-f16.gguf"))
    backend = Backend(1)
    tokens = np.array([5, 17, 42, 99, 7, 300, 12, 8, 64, 65], np.int32)
    n, keep, drop = len(tokens), 2, 3

    def run(positions, tok):
        cache = KVCache(model.cache_layout(), 32)
        Forward(model, backend, cache)(tok, positions, np.zeros(len(tok)), np.array([len(tok) - 1]))
        return cache

    shifted = run(np.arange(n), tokens)
    shifted.shift(0, keep, drop, KeyRotator(model, backend))
    kept = np.r_[tokens[:keep], tokens[keep + drop:]]
    fresh = run(np.arange(len(kept)), kept)
    assert list(shifted.seq_positions(0)) == list(range(len(kept)))
    got = shifted.k[0][shifted.groups[0].cells.cells_of(0)].view(np.float16).astype(np.float32)
    want = fresh.k[0][: len(kept)].view(np.float16).astype(np.float32)
    assert np.allclose(got, want, atol=2e-2, rtol=1e-2)
    moved = got[keep:] - want[keep:]
    # and the rotation did something: the unrotated keys are far off
    before = run(np.arange(n), tokens).k[0][keep + drop:n].view(np.float16).astype(np.float32)
    assert np.abs(before - want[keep:]).max() > 10 * np.abs(moved).max()


def test_shift_of_a_shared_sequence_leaves_the_other_alone():
    cache = KVCache(full_layout(1, 2), 16)
    alloc(cache, 0, range(6))
    for cell in range(6):
        cache.k[0][cell] = np.array([cell, 0], np.float16).view(np.uint16)
    cache.copy_prefix(0, 1, 6)

    def plus_one(layers, rows, delta):
        return [r + 1 for r in rows]

    cache.shift(0, 1, 2, plus_one)
    table = cache.groups[0].cells
    assert list(table.positions_of(1)) == list(range(6))
    assert list(table.positions_of(0)) == [0, 1, 2, 3]
    k = cache.k[0].view(np.float16)
    assert k[table.cells_of(1), 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert k[table.cells_of(0), 0].tolist() == [0, 4, 5, 6]


def test_cell_table_compaction_order_is_stable():
    table = CellTable(6)
    table.record(np.array([1, 3, 5]), np.array([0, 1, 2]), np.array([2, 2, 2]))
    order = table.compaction()
    table.rebuild(order, table.seq[order].copy())
    assert table.positions_of(2).tolist() == [0, 1, 2] and table.cells_of(2).tolist() == [0, 1, 2]


def test_one_batch_never_gives_a_cell_twice():
    """A batch of lone tokens where some sequences' next cells are taken: each token gets
    its own free cell above its sequence's last one (A's next cell is X's, so A looks for
    free cells; B's next is free; C's next is the one A got)."""
    a, b, c, x, y = 0, 1, 2, 3, 4
    table = CellTable(10)
    table.record(np.array([0, 1, 2, 4, 6]), np.zeros(5, np.int32), np.array([a, x, c, b, y]))
    slots = table.plan(np.ones(3, np.int32), np.array([a, b, c]))
    assert len(set(slots.tolist())) == 3
    assert all(table.seq[s] == 0 for s in slots)
    assert slots[0] > 0 and slots[1] > 4 and slots[2] > 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lone_tokens_take_the_lowest_free_cell_above_their_last(seed):
    """Sequences decoding side by side take turns at the top of the cache: each lone token
    gets the lowest free cell above its sequence's last that no earlier token of the
    batch took (found by probing a few cells, or by the free map past them)."""
    rng = np.random.default_rng(seed)
    n_cells, n_seq = 64, 5
    table = CellTable(n_cells)
    used = rng.choice(n_cells - 12, size=30, replace=False)
    table.record(np.sort(used), np.arange(30, dtype=np.int32), rng.integers(0, n_seq, 30))
    seqs = rng.permutation(n_seq)
    slots = table.plan(np.full(n_seq, 100, np.int32), seqs)
    taken: list[int] = []
    for sid, slot in zip(seqs.tolist(), slots.tolist()):
        free = [c for c in range(table.last_cell(sid) + 1, n_cells) if table.seq[c] == 0 and c not in taken]
        assert slot == free[0], (sid, slot, free[:3])
        taken.append(slot)
