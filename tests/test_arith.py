"""Which of llama.cpp's batch-dependent arithmetic paths a token follows
(pyengine/runner/arith.py): the rules, and that they depend on a token's own
sequence only."""

from __future__ import annotations

import numpy as np

from pyengine.runner.arith import (LLAMA_UBATCH, PATH_MULTI, PATH_TILE4, PATH_WIDE, Arith, batch_arith,
                                   generated_arith, prompt_arith)


def paths_of(arith: Arith, bit: int) -> list[int]:
    return [int(p & bit != 0) for p in arith.paths]


def test_a_generated_token_is_a_batch_of_its_own():
    a = generated_arith(3)
    assert a.lone.tolist() == [1, 1, 1]
    assert paths_of(a, PATH_TILE4) == [0, 0, 0] and paths_of(a, PATH_WIDE) == [0, 0, 0]


def test_prompt_rows_in_4_row_tiles_except_the_last_len_mod_4():
    a = prompt_arith(np.arange(10), 10)
    assert paths_of(a, PATH_TILE4) == [1] * 8 + [0, 0]
    assert paths_of(a, PATH_WIDE) == [1] * 10          # a batch of 10 >= 8 rows
    assert paths_of(a, PATH_MULTI) == [1] * 10
    assert a.lone.tolist() == [0] * 10


def test_short_prompts_are_not_wide_and_a_one_token_prompt_is_lone():
    assert paths_of(prompt_arith(np.arange(7), 7), PATH_WIDE) == [0] * 7
    one = prompt_arith(np.arange(1), 1)
    assert one.lone.tolist() == [1] and one.paths.tolist() == [0]


def test_long_prompts_follow_llamacpp_ubatches_whatever_the_chunking():
    n = LLAMA_UBATCH + 6                                    # ubatches of 512 and 6 rows
    whole = prompt_arith(np.arange(n), n)
    chunks = Arith.concat([prompt_arith(np.arange(s, min(s + 7, n)), n) for s in range(0, n, 7)])
    assert np.array_equal(whole.paths, chunks.paths) and np.array_equal(whole.lone, chunks.lone)
    assert paths_of(whole, PATH_WIDE)[LLAMA_UBATCH:] == [0] * 6      # the second ubatch has 6 rows
    assert paths_of(whole, PATH_TILE4)[LLAMA_UBATCH:] == [1, 1, 1, 1, 0, 0]


def test_batch_arith_takes_each_sequence_on_its_own():
    seq = np.array([0, 1, 1, 1, 1, 1, 2])
    a = batch_arith(seq)
    assert a.lone.tolist() == [1, 0, 0, 0, 0, 0, 1]
    assert paths_of(a, PATH_TILE4) == [0, 1, 1, 1, 1, 0, 0]
    assert np.array_equal(batch_arith(np.array([5, 5, 5, 5, 5])).paths, a.paths[1:6])
