"""What the Qwen-VL tests share: the recorded prompt fed by hand as libmtmd feeds
llama.cpp (M-RoPE positions), the same prompt through the engine, and a chat turn
with an image_url."""

from __future__ import annotations

import base64

import numpy as np


def prompt_logits(fw, segments, rows: np.ndarray, wrong: str | None = None) -> np.ndarray:
    """The logits after the recorded prompt, fed as mtmd_helper_eval_chunks feeds llama.cpp:
    the text around the image as tokens, the image as `rows` at M-RoPE positions
    (t, t + row, t + column), the text after it from t + max(rows, columns)."""
    pos, rope = 0, 0   # the cache's position (the tokens' order), the rope's
    for seg in segments:
        if "tokens" in seg:
            n = len(seg["tokens"])
            logits = fw(np.array(seg["tokens"]), np.arange(pos, pos + n), np.zeros(n, np.int64), [n - 1],
                        rope_positions=None if rope == pos else text_rope(rope, n))
            pos, rope = pos + n, rope + n
            continue
        n_y, n_x = seg["grid"]
        ty, tx = np.divmod(np.arange(n_y * n_x), n_x)
        streams = np.stack([np.full_like(ty, rope), rope + ty, rope + tx, np.zeros_like(ty)], axis=1)
        if wrong == "sections_ignored":   # the image's rows as a run of text positions
            streams = text_rope(rope, n_y * n_x)
        n = len(rows)
        logits = fw.embedded(rows, np.arange(pos, pos + n), np.zeros(n, np.int64), [n - 1], rope_positions=streams)
        pos += n
        rope += n if wrong in ("sections_ignored", "positions_not_skipped") else max(n_y, n_x)
    return logits[0]


def text_rope(start: int, n: int) -> np.ndarray:
    """Text tokens' M-RoPE positions from `start`: the position in three streams, 0 in the fourth."""
    p = np.arange(start, start + n)
    return np.stack([p, p, p, np.zeros_like(p)], axis=1)


def recorded_prompt(segments, rows: np.ndarray) -> tuple[list[int], list[tuple[int, np.ndarray]]]:
    """The recorded prompt's token ids (placeholders where the image goes) and the engine's images."""
    ids, images = [], []
    for seg in segments:
        if "tokens" in seg:
            ids += seg["tokens"]
        else:
            images.append((len(ids), rows))
            ids += [0] * seg["image"]
    return ids, images


def engine_matches_recording(llm, recorded: dict, rows: np.ndarray, bound: float = 0.05) -> None:
    """The engine's first token over the recorded prompt is llama.cpp's, and its top
    log-probabilities differ from llama.cpp's logits by one constant (within `bound`)."""
    from pyengine.sample import SamplingOptions

    ids, images = recorded_prompt(recorded["segments"], rows)
    handle = llm.engine.submit(ids, SamplingOptions(temperature=0), max_tokens=2, logprobs=True, top_logprobs=20,
                               images=images)
    top = dict(handle.result().logprobs[0].top)
    best, best_logit = recorded["top_logits"][0]
    assert next(iter(top)) == best
    for token, logit in recorded["top_logits"]:
        assert abs((top[token] - top[best]) - (logit - best_logit)) < bound


def chat_first_token(llm, png: bytes) -> dict:
    """{token: logprob} of the five best first tokens of a chat turn with the image as an image_url."""
    r = llm.create_chat_completion(
        [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                      {"type": "image_url", "image_url": {
                                          "url": "data:image/png;base64," + base64.b64encode(png).decode()}}]}],
        max_tokens=1, temperature=0, logprobs=True, top_logprobs=5)
    return {t["token"]: t["logprob"] for t in r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}
