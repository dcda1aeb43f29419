"""Images in chats: LLM(model, mmproj=...), images in Ollama's and OpenAI's message shapes,
the engine feeding an image's rows at its place in the prompt, and llama.cpp's logits
after the recorded image prompt (tests/data/vision, scripts/make_synth_vision.py)."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from conftest import DATA
from PIL import Image

from pyengine.api import LLM
from pyengine.errors import ImageError, InvalidOptionError, ModelError, UnsupportedError
from pyengine.sample import SamplingOptions
from pyengine.session import prepare_chat
from pyengine.vision.prompt import MARKER, take_images

VISION = DATA / "vision"
TEXT, MMPROJ, PNG = VISION / "gemma3-tiny.gguf", VISION / "gemma3-tiny.mmproj.gguf", VISION / "gemma3-tiny.png"
RECORDED = json.loads((VISION / "gemma3-tiny.embd.json").read_text())


@pytest.fixture(scope="module")
def llm():
    with LLM(TEXT, n_ctx=256, n_threads=2, mmproj=MMPROJ) as model:
        yield model


def other_png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def recorded_prompt(rows: np.ndarray) -> tuple[list[int], list[tuple[int, np.ndarray]]]:
    ids, images = [], []
    for seg in RECORDED["segments"]:
        if "tokens" in seg:
            ids += seg["tokens"]
        else:
            images.append((len(ids), rows))
            ids += [0] * seg["image"]
    return ids, images


def first_top_logprobs(handle) -> dict[int, float]:
    return dict(handle.result().logprobs[0].top)


def test_engine_places_the_image_and_matches_llama_cpp(llm):
    rows = llm.projector.embed(PNG.read_bytes())
    ids, images = recorded_prompt(rows)
    top = first_top_logprobs(llm.engine.submit(ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True,
                                               top_logprobs=10, images=images))
    best, best_logit = RECORDED["top_logits"][0]
    assert next(iter(top)) == best
    # log-probabilities differ from logits by one constant: compare each against the best token's
    for token, logit in RECORDED["top_logits"]:
        assert abs((top[token] - top[best]) - (logit - best_logit)) < 0.05


def test_engine_feeds_what_forward_feeds(llm):
    """The engine's chunks around the image (a prompt chunked at its edges, the image as
    one batch of rows) give the bits of the hand-fed segments."""
    from pyengine.kvcache import KVCache
    from pyengine.ml.context import Backend
    from pyengine.runner.forward import Forward

    rows = llm.projector.embed(PNG.read_bytes())
    ids, images = recorded_prompt(rows)
    fw = Forward(llm.model, Backend(2), KVCache(llm.model.cache_layout(), 128))
    start, n = images[0][0], len(rows)
    fw(np.array(ids[:start]), np.arange(start), np.zeros(start, np.int64), [start - 1])
    fw.embedded(rows, np.arange(start, start + n), np.zeros(n, np.int64), [n - 1], both_ways=True)
    rest = len(ids) - start - n
    logits = fw(np.array(ids[start + n:]), np.arange(start + n, len(ids)), np.zeros(rest, np.int64), [rest - 1])[0]
    logprobs = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64) - logits.max()).sum()) - logits.max()
    top = first_top_logprobs(llm.engine.submit(ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True,
                                               top_logprobs=10, images=images))
    for token, value in top.items():
        assert value == pytest.approx(logprobs[token], abs=1e-5)


def test_chat_with_images_in_both_shapes(llm):
    png = PNG.read_bytes()
    ollama = llm.chat([{"role": "user", "content": "What is this?", "images": [base64.b64encode(png).decode()]}],
                      max_tokens=3, temperature=0)
    by_argument = llm.chat([{"role": "user", "content": "What is this?"}], images=[png], max_tokens=3, temperature=0)
    assert ollama["message"] == by_argument["message"]
    assert ollama["prompt_eval_count"] > 16 + 5
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = [{"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "What is this?"}]
    openai = llm.create_chat_completion([{"role": "user", "content": parts}], max_tokens=3, temperature=0)
    assert openai["choices"][0]["message"]["content"] == ollama["message"]["content"]


def test_two_images_give_two_answers_and_one_image_the_same_twice(llm):
    def top(png: bytes) -> dict:
        r = llm.create_chat_completion([{"role": "user", "content": "Describe.", "images": [png]}],
                                       max_tokens=1, temperature=0, logprobs=True, top_logprobs=5)
        return {t["token"]: t["logprob"] for t in r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}

    a, b = top(PNG.read_bytes()), top(other_png(3))
    assert a != b
    assert top(PNG.read_bytes()) == a


def test_the_prompt_holds_the_image_between_its_markers(llm):
    prepared = prepare_chat(llm, [{"role": "user", "content": "Hi", "images": [PNG.read_bytes()]}])
    (start, rows), = prepared.images
    assert rows.shape == (16, 64) and prepared.ids[start:start + 16] == [0] * 16
    before = llm.tokenizer.encode("<start_of_image>", add_special=False, parse_special=True)
    after = llm.tokenizer.encode("<end_of_image>", add_special=False, parse_special=True)
    assert prepared.ids[start - len(before):start] == before
    assert prepared.ids[start + 16:start + 16 + len(after)] == after
    assert MARKER in prepared.text


def test_take_images_keeps_the_order_and_leaves_the_input_alone():
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": "X"}],
                 "images": ["Y"]}]
    marked, found = take_images(messages, images=["Z"])
    assert found == ["Z", "Y", "X"]
    assert "images" in messages[0] and marked[0]["content"][0]["text"] == MARKER * 2
    assert [p["text"] for p in marked[0]["content"][1:]] == ["a", MARKER]


def test_bad_images_and_models_without_a_projector(llm):
    with pytest.raises(ImageError):
        llm.chat([{"role": "user", "content": "x", "images": ["not base64!"]}], max_tokens=1)
    with pytest.raises(ImageError):
        llm.chat([{"role": "user", "content": "x", "images": [b"\x89PNG truncated"]}], max_tokens=1)
    with pytest.raises(ImageError, match="not fetched"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}],
                 max_tokens=1)
    with pytest.raises(InvalidOptionError, match="user message"):
        llm.chat([{"role": "system", "content": "x"}], images=[PNG.read_bytes()], max_tokens=1)
    with LLM(TEXT, n_ctx=64, n_threads=1) as plain:
        with pytest.raises(UnsupportedError, match="vision projector"):
            plain.chat([{"role": "user", "content": "x", "images": [PNG.read_bytes()]}], max_tokens=1)


def test_a_projector_for_another_width_fails_at_load(tmp_path):
    with pytest.raises(ModelError, match=r"width 64.*image rows of width 128"):
        LLM(DATA / "synth" / "mistral3-q8_0.gguf", n_ctx=64, n_threads=1, mmproj=MMPROJ)


def test_engine_refuses_bad_image_spans(llm):
    rows = np.zeros((16, 64), np.float32)
    ids = [5] * 20
    for images, message in [([(10, rows)], "passes the prompt"), ([(0, rows[:, :8])], "rows must be"),
                            ([(0, rows[:8]), (4, rows[:8])], "overlaps")]:
        with pytest.raises(InvalidOptionError, match=message):
            llm.engine.submit(ids, max_tokens=1, images=images)
