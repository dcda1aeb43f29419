"""Prefix reuse over images: a prompt's image positions are keyed by the image's
content, so a second question about the same image reuses its cells (and the text
before and after it), while another image at the same place reuses nothing past it."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from conftest import DATA
from PIL import Image

from pyengine.api import LLM
from pyengine.runner.engine import before_image, image_keyed
from pyengine.sample import SamplingOptions
from pyengine.session import prepare_chat

VISION = DATA / "vision"
TEXT, MMPROJ, PNG = VISION / "gemma3-tiny.gguf", VISION / "gemma3-tiny.mmproj.gguf", VISION / "gemma3-tiny.png"
CONTEXT = " ".join(f"line {i} of the notes about the picture." for i in range(200))


@pytest.fixture(scope="module")
def llm():
    with LLM(TEXT, n_ctx=4096, n_threads=2, mmproj=MMPROJ) as model:
        yield model


def other_png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def ask(llm, image: bytes, question: str, notes: str = CONTEXT):
    """(the first token's log-probabilities, the completion, the prepared prompt) of a question
    after the image and notes; the completion's `ttft` is the engine's time from submit to
    the first token (the prompt's rendering and the projector are not what the cache saves)."""
    messages = [{"role": "user", "content": notes, "images": [image]}, {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": question}]
    prepared = prepare_chat(llm, messages)
    started = time.perf_counter()
    handle = llm.engine.submit(prepared.ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True,
                               top_logprobs=8, images=prepared.images)
    result = handle.result()
    result.ttft = time.perf_counter() - started
    return dict(result.logprobs[0].top), result, prepared


def computed(done) -> int:
    """The prompt positions a request computed (the rest came from the cache)."""
    return done.prompt_tokens - done.cached_tokens


def test_the_same_image_reuses_its_cells_and_gives_the_same_bits(llm, monkeypatch):
    ask(llm, other_png(9), "Warm up.")
    first, done, prepared = ask(llm, PNG.read_bytes(), "What colour is it?")
    (start, rows), = prepared.images
    assert done.cached_tokens <= start
    first_work, first_ttft = computed(done), done.ttft
    towers = []
    encode = llm.projector.tower.encode
    monkeypatch.setattr(llm.projector.tower, "encode", lambda *a: towers.append(1) or encode(*a))
    again, done, prepared = ask(llm, PNG.read_bytes(), "What shape is it?")
    assert done.cached_tokens > start + len(rows)       # the image and the notes were reused
    assert towers == []                                 # and the tower did not run again
    print(f"time to first token: first {first_ttft * 1e3:.1f} ms, same image again {done.ttft * 1e3:.1f} ms; "
          f"prompt positions computed {first_work} then {computed(done)}")
    assert computed(done) * 5 <= first_work
    # reused cells give the bits computing them afresh gives
    llm.engine.drop_cache()
    fresh, done, _ = ask(llm, PNG.read_bytes(), "What shape is it?")
    assert done.cached_tokens <= start and fresh == again
    ask(llm, other_png(11), "And this one?")
    assert len(towers) == 1                             # a new image runs the tower


def test_another_image_reuses_nothing_past_its_start(llm):
    a, _, prepared = ask(llm, PNG.read_bytes(), "Describe it.", notes="Short notes.")
    (start, _rows), = prepared.images
    b, done, _ = ask(llm, other_png(5), "Describe it.", notes="Short notes.")
    assert done.cached_tokens <= start
    assert a != b


def test_keys_by_content_and_cuts_at_image_starts():
    rows_a, rows_b = np.zeros((4, 8), np.float32), np.ones((4, 8), np.float32)
    prompt = [7, 0, 0, 0, 0, 9]
    a, a2, b = image_keyed(prompt, {1: rows_a}), image_keyed(prompt, {1: rows_a.copy()}), image_keyed(prompt, {1: rows_b})
    assert a == a2 and a != b and a[0] == 7 and a[5] == 9
    assert all(k < 0 for k in a[1:5]) and len(set(a[1:5])) == 4
    assert [before_image({1: rows_a}, n) for n in range(7)] == [0, 1, 1, 1, 1, 5, 6]


def test_recent_images_cache_is_bounded_and_least_recently_used_goes_first():
    from pyengine.vision.projector import EmbeddingCache
    cache = EmbeddingCache(3 * 400)
    rows = {k: np.full((10, 10), i, np.float32) for i, k in enumerate([b"a", b"b", b"c", b"d"])}   # 400 bytes each
    for key in (b"a", b"b", b"c"):
        cache.put(key, ["text", rows[key]])
    assert cache.get(b"a")[1] is rows[b"a"]              # a is now the most recent
    cache.put(b"d", [rows[b"d"]])
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.used == 1200
    cache.put(b"huge", [np.zeros((100, 100), np.float32)])  # larger than the whole cache: not kept
    assert cache.get(b"huge") is None and cache.used == 1200
