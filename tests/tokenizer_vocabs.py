"""Small synthetic vocabularies (GGUF metadata dicts) for the tokenizer's unit tests."""

from __future__ import annotations

import numpy as np

from pyengine.tokenizer.bpe import BYTE_TO_CHAR

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def spm_metadata(extra: dict[str, tuple[float, int]] | None = None, **keys) -> dict:
    """A SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    pieces = {"▁": (-1.0, NORMAL), "▁a": (-2.0, NORMAL), "▁ab": (-3.0, NORMAL),
              "ab": (-2.5, NORMAL), "b": (-4.0, NORMAL), "a": (-4.0, NORMAL),
              "c": (-4.0, NORMAL), "▁c": (-3.5, NORMAL), "中": (-5.0, NORMAL)}
    pieces.update(extra or {})
    for text, (score, kind) in pieces.items():
        tokens.append(text)
        scores.append(score)
        types.append(kind)
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    meta.update(keys)
    return meta


def bpe_metadata(merges: list[str] | None = None, extra: list[tuple[str, int]] | None = None,
                 pre: str = "gpt-2", **keys) -> dict:
    """A byte-level BPE vocabulary: the 256 byte characters, merges and their results."""
    tokens = list(BYTE_TO_CHAR)
    types = [NORMAL] * 256
    merges = merges if merges is not None else ["Ġ t", "h e", "Ġt he", "Ġ a", "a b", "ab c"]
    for merge in merges:
        left, right = merge.split(" ")
        if left + right not in tokens:
            tokens.append(left + right)
            types.append(NORMAL)
    for text, kind in extra or []:
        tokens.append(text)
        types.append(kind)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.merges": merges,
    }
    meta.update(keys)
    return meta
