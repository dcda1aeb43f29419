"""The vocabulary every tokenizer family shares, read from GGUF metadata.

A `Vocab` holds the token strings, scores and attributes, the special ids and the
flags that steer tokenization (add_bos, add_space_prefix, ...). It reproduces what
llama.cpp's vocabulary loader decides from the same metadata: per-family defaults,
the pre-tokenizer's overrides, special ids from the metadata, the end-of-generation
set found by token text, and the attribute fix-ups that change how special tokens
are matched and rendered.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pyengine.errors import TokenizerError
from pyengine.tokenizer.pretokenizers import PreTokenizer, pre_tokenizer_for

# tokenizer.ggml.model -> the family that tokenizes it.
FAMILIES: dict[str, str] = {
    "llama": "spm",   # SentencePiece BPE: scores, byte fallback, ▁ for spaces
    "gpt2": "bpe",    # byte-level BPE with ranked merges and a regex pre-tokenizer
    "gemma4": "bpe",  # BPE over raw UTF-8 with ▁ for spaces (no byte-level mapping)
    "bert": "wpm",    # WordPiece
    "t5": "ugm",      # Unigram with a precompiled normalizer
}

ESCAPED_SPACE = "\u2581"  # ▁ stands for a space in SentencePiece-style vocabularies


class TokenType(enum.IntEnum):
    """tokenizer.ggml.token_type values."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class Attr:
    """Per-token attribute bits (llama.cpp's llama_token_attr); plain ints, for speed."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


_ATTR_OF_TYPE = {
    TokenType.UNDEFINED: Attr.UNDEFINED,
    TokenType.NORMAL: Attr.NORMAL,
    TokenType.UNKNOWN: Attr.UNKNOWN,
    TokenType.CONTROL: Attr.CONTROL,
    TokenType.USER_DEFINED: Attr.USER_DEFINED,
    TokenType.UNUSED: Attr.UNUSED,
    TokenType.BYTE: Attr.BYTE,
}

# Tokens llama.cpp finds by their text (convert scripts do not always say which is which).
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
))
# gpt-oss: always rendered, never treated as control.
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# Metadata key -> special id field; later keys (deprecated aliases) override earlier.
_SPECIAL_ID_KEYS = (
    ("tokenizer.ggml.bos_token_id", "bos"),
    ("tokenizer.ggml.eos_token_id", "eos"),
    ("tokenizer.ggml.eot_token_id", "eot"),
    ("tokenizer.ggml.eom_token_id", "eom"),
    ("tokenizer.ggml.unknown_token_id", "unk"),
    ("tokenizer.ggml.seperator_token_id", "sep"),
    ("tokenizer.ggml.padding_token_id", "pad"),
    ("tokenizer.ggml.mask_token_id", "mask"),
    ("tokenizer.ggml.fim_pre_token_id", "fim_pre"),
    ("tokenizer.ggml.fim_suf_token_id", "fim_suf"),
    ("tokenizer.ggml.fim_mid_token_id", "fim_mid"),
    ("tokenizer.ggml.fim_pad_token_id", "fim_pad"),
    ("tokenizer.ggml.fim_rep_token_id", "fim_rep"),
    ("tokenizer.ggml.fim_sep_token_id", "fim_sep"),
    ("tokenizer.ggml.prefix_token_id", "fim_pre"),
    ("tokenizer.ggml.suffix_token_id", "fim_suf"),
    ("tokenizer.ggml.middle_token_id", "fim_mid"),
)

# Default special ids per family (llama.cpp's), before the metadata is read.
_DEFAULT_IDS: dict[str, dict[str, int]] = {
    "spm": {"bos": 1, "eos": 2, "unk": 0},
    "wpm": {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103},
    "bpe": {"bos": 11, "eos": 11},
    "ugm": {"eos": 1, "unk": 2, "pad": 0},
}


@dataclass
class Flags:
    """Switches that steer tokenization, as llama.cpp derives them."""

    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    remove_extra_whitespaces: bool = False
    escape_whitespaces: bool = True
    treat_whitespace_as_suffix: bool = False
    clean_spaces: bool = False
    ignore_merges: bool = False
    lowercase: bool = True       # WordPiece normalizer
    strip_accents: bool = True   # WordPiece normalizer


_FAMILY_FLAGS: dict[str, dict[str, bool]] = {
    "spm": {"add_space_prefix": True, "add_bos": True},
    "wpm": {"add_bos": True, "add_sep": True, "clean_spaces": True},
    "bpe": {"escape_whitespaces": False, "clean_spaces": True},
    "ugm": {"add_eos": True},
}


@dataclass
class Vocab:
    """Everything the tokenizers need from tokenizer.ggml.* (and general.name)."""

    model: str                    # tokenizer.ggml.model
    family: str                   # "spm" | "bpe" | "wpm" | "ugm"
    tokens: list[str]
    scores: Sequence[float]       # array("f")
    attrs: Sequence[int]          # array("i") of Attr bits
    token_to_id: dict[str, int]
    flags: Flags
    special: dict[str, int | None]  # bos, eos, eot, eom, unk, sep, pad, mask, fim_*
    eog_ids: frozenset[int]
    merges: list[str] = field(default_factory=list)
    pre: PreTokenizer | None = None  # BPE only
    precompiled_charsmap: bytes = b""

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def is_control(self, token_id: int) -> bool:
        return bool(self.attrs[token_id] & Attr.CONTROL)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, object]) -> Vocab:
        return _build(metadata)


# --------------------------------------------------------------------------------------
# Reading metadata
# --------------------------------------------------------------------------------------


def _get_str(metadata: Mapping[str, object], key: str, default: str | None = None) -> str | None:
    value = metadata.get(key, default)
    if value is not None and not isinstance(value, str):
        raise TokenizerError(f"metadata key {key!r} should be a string, got {type(value).__name__}")
    return value


def _get_bool(metadata: Mapping[str, object], key: str) -> bool | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TokenizerError(f"metadata key {key!r} should be a bool, got {value!r}")


def _get_id(metadata: Mapping[str, object], key: str, n_vocab: int) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TokenizerError(f"metadata key {key!r} should be a token id, got {value!r}")
    value = int(value)
    if value == -1 or value == 0xFFFFFFFF:  # LLAMA_TOKEN_NULL written by some converters
        return None
    if not 0 <= value < n_vocab:
        raise TokenizerError(f"{key} = {value} is out of range for a vocabulary of {n_vocab} tokens")
    return value


def _get_array(metadata: Mapping[str, object], key: str) -> Sequence | np.ndarray | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TokenizerError(f"metadata key {key!r} should be an array, got {type(value).__name__}")
    return value


def _string_list(metadata: Mapping[str, object], key: str) -> list[str] | None:
    values = _get_array(metadata, key)
    if values is None:
        return None
    strings = [] if isinstance(values, np.ndarray) else list(values)
    if isinstance(values, np.ndarray) or not set(map(type, strings)) <= {str}:
        raise TokenizerError(f"metadata key {key!r} should be an array of strings")
    return strings


def _numeric_list(metadata: Mapping[str, object], key: str, n_vocab: int, kind: type) -> list | None:
    values = _get_array(metadata, key)
    if values is None:
        return None
    try:
        array = np.asarray(values)
        if array.ndim != 1 or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
            raise ValueError
        converted = array.astype(np.float64 if kind is float else np.int64).tolist()
    except (ValueError, TypeError, OverflowError):
        raise TokenizerError(f"metadata key {key!r} should be a numeric array") from None
    if len(converted) != n_vocab:
        raise TokenizerError(
            f"{key} has {len(converted)} entries but tokenizer.ggml.tokens has {n_vocab}; "
            "the vocabulary's arrays must have one entry per token")
    return converted


# --------------------------------------------------------------------------------------
# Building a Vocab the way llama.cpp's loader does
# --------------------------------------------------------------------------------------


def _build(metadata: Mapping[str, object]) -> Vocab:
    if not isinstance(metadata, Mapping):
        raise TokenizerError("tokenizer metadata must be a mapping of GGUF keys to values")
    model = _get_str(metadata, "tokenizer.ggml.model")
    if model is None:
        raise TokenizerError("no tokenizer.ggml.model in the metadata: the file has no vocabulary")
    family = FAMILIES.get(model)
    if family is None:
        known = ", ".join(sorted(FAMILIES))
        raise TokenizerError(f"unknown tokenizer.ggml.model {model!r} (supported: {known})")

    tokens = _string_list(metadata, "tokenizer.ggml.tokens")
    if not tokens:
        raise TokenizerError("tokenizer.ggml.tokens is missing or empty")
    n_vocab = len(tokens)
    tokens = [tok if tok else f"[EMPTY_{i}]" for i, tok in enumerate(tokens)]
    token_to_id = dict(zip(tokens, range(n_vocab)))
    if len(token_to_id) != n_vocab:
        raise TokenizerError(f"duplicate token in vocabulary: {_first_duplicate(tokens)!r}")

    # compact arrays rather than lists of Python numbers: ~10 MB less for a 262k vocabulary
    # (the scores are float32 in the file, so nothing is lost)
    scores = array("f", _numeric_list(metadata, "tokenizer.ggml.scores", n_vocab, float) or [0.0] * n_vocab)
    types = _numeric_list(metadata, "tokenizer.ggml.token_type", n_vocab, int)
    attrs = array("i", [_ATTR_OF_TYPE.get(t, Attr.UNDEFINED) for t in types] if types else [Attr.NORMAL] * n_vocab)

    flags = Flags(**_FAMILY_FLAGS[family])
    special: dict[str, int | None] = dict.fromkeys(
        ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask",
         "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"))
    special.update(_DEFAULT_IDS[family])

    merges: list[str] = []
    pre: PreTokenizer | None = None
    if family == "bpe":
        merges = _string_list(metadata, "tokenizer.ggml.merges") or []
        if not merges:
            raise TokenizerError("a BPE vocabulary needs tokenizer.ggml.merges")
        pre_name = "gemma4" if model == "gemma4" else (_get_str(metadata, "tokenizer.ggml.pre") or "default")
        if model == "gemma4":
            special.update(bos=None, eos=None, unk=None)
        pre = pre_tokenizer_for(pre_name)
        _apply_pre_flags(pre, flags, special)

    for key, attr in (("tokenizer.ggml.add_space_prefix", "add_space_prefix"),
                      ("tokenizer.ggml.remove_extra_whitespaces", "remove_extra_whitespaces")):
        value = _get_bool(metadata, key)
        if value is not None:
            setattr(flags, attr, value)

    _read_special_ids(metadata, special, n_vocab)
    _read_add_flags(metadata, flags, special, pre)

    lowercase = _get_bool(metadata, "tokenizer.ggml.normalizer.lowercase")
    if lowercase is not None:
        flags.lowercase = lowercase
    flags.strip_accents = flags.lowercase
    strip = _get_bool(metadata, "tokenizer.ggml.normalizer.strip_accents")
    if strip is not None:
        flags.strip_accents = strip

    eog_ids = _find_special_by_text(tokens, attrs, token_to_id, special)
    name = (_get_str(metadata, "general.name", "") or "").lower()
    arch = _get_str(metadata, "general.architecture", "") or ""
    pre_text = _get_str(metadata, "tokenizer.ggml.pre", "") or ""
    _set_strip_attrs(attrs, token_to_id, name, arch, pre_text)

    charsmap = b""
    if family == "ugm":
        charsmap = _charsmap(metadata)

    return Vocab(model=model, family=family, tokens=tokens, scores=scores, attrs=attrs,
                 token_to_id=token_to_id, flags=flags, special=special, eog_ids=eog_ids,
                 merges=merges, pre=pre, precompiled_charsmap=charsmap)


def _first_duplicate(tokens: list[str]) -> str:
    seen: set[str] = set()
    for tok in tokens:
        if tok in seen:
            return tok
        seen.add(tok)
    return ""


def _apply_pre_flags(pre: PreTokenizer, flags: Flags, special: dict[str, int | None]) -> None:
    flags.clean_spaces = pre.clean_spaces
    flags.ignore_merges = pre.ignore_merges
    flags.escape_whitespaces = pre.escape_whitespaces
    if pre.add_bos:
        flags.add_bos = True
    if pre.add_sep:
        flags.add_sep = True
    if pre.no_bos:
        special["bos"] = None
    if not pre.lowercase:
        flags.lowercase = False


def _read_special_ids(metadata: Mapping[str, object], special: dict[str, int | None],
                      n_vocab: int) -> None:
    for name, value in list(special.items()):  # defaults past the vocabulary are disabled
        if value is not None and value >= n_vocab:
            special[name] = None
    for key, name in _SPECIAL_ID_KEYS:
        if key in metadata:
            special[name] = _get_id(metadata, key, n_vocab)


def _read_add_flags(metadata: Mapping[str, object], flags: Flags,
                    special: dict[str, int | None], pre: PreTokenizer | None) -> None:
    for key, attr in (("tokenizer.ggml.add_bos_token", "add_bos"),
                      ("tokenizer.ggml.add_eos_token", "add_eos"),
                      ("tokenizer.ggml.add_sep_token", "add_sep")):
        value = _get_bool(metadata, key)
        if value is not None:
            setattr(flags, attr, value)
    if pre is not None and pre.name == "gemma4":
        flags.add_bos = True  # llama.cpp forces it for Gemma 4
    for attr, name in (("add_bos", "bos"), ("add_eos", "eos"), ("add_sep", "sep")):
        if getattr(flags, attr) and special[name] is None:
            raise TokenizerError(
                f"tokenizer.ggml.{attr}_token is true but the vocabulary has no {name} token id")


def _find_special_by_text(tokens: list[str], attrs: list[int], token_to_id: dict[str, int],
                          special: dict[str, int | None]) -> frozenset[int]:
    """EOT/EOM/FIM ids by text where the metadata gave none, and the end-of-generation set.

    Every token found this way becomes a control token (as in llama.cpp), which changes
    how it is matched in text and rendered.
    """
    def mark_control(token_id: int) -> None:
        attrs[token_id] |= Attr.CONTROL

    def first_present(texts: Sequence[str]) -> int | None:
        for text in texts:  # deterministic: the first text in llama.cpp's list wins
            token_id = token_to_id.get(text)
            if token_id is not None:
                return token_id
        return None

    for name, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), *_FIM_TEXTS.items()):
        if special[name] is None:
            found = first_present(texts)
            if found is not None:
                special[name] = found
                mark_control(found)

    for token_id, attr in enumerate(attrs):  # control tokens named "unused" are unused
        if attr & Attr.CONTROL and "unused" in tokens[token_id]:
            attrs[token_id] |= Attr.UNUSED

    eog = {special[name] for name in ("fim_pad", "fim_rep", "fim_sep") if special[name] is not None}
    for text in _EOG_TEXTS:
        token_id = token_to_id.get(text)
        if token_id is not None:
            eog.add(token_id)
            mark_control(token_id)
    for text in _ALWAYS_RENDERED:
        token_id = token_to_id.get(text)
        if token_id is not None:
            attrs[token_id] = Attr.USER_DEFINED
    eog.update(special[name] for name in ("eos", "eot", "eom") if special[name] is not None)
    _drop_false_eog(tokens, attrs, eog)
    return frozenset(eog)


def _drop_false_eog(tokens: list[str], attrs: list[int], eog: set[int]) -> None:
    by_text = {tokens[token_id]: token_id for token_id in eog}
    # o200k_harmony and solar-open: "<|end|>" ends a message, not the generation.
    has_call = "<|call|>" in by_text or "<|calls|>" in by_text
    if "<|end|>" in by_text and has_call and ("<|return|>" in by_text or "<|flush|>" in by_text):
        end_id = by_text["<|end|>"]
        eog.discard(end_id)
        attrs[end_id] = Attr.USER_DEFINED
    # Gemma 4 and PLaMo have an ordinary "</s>".
    if "</s>" in by_text and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):
        s_id = by_text["</s>"]
        eog.discard(s_id)
        attrs[s_id] = Attr.NORMAL


def _set_strip_attrs(attrs: list[int], token_to_id: dict[str, int], name: str, arch: str,
                     pre_text: str) -> None:
    """Per-model whitespace stripping around special tokens (llama.cpp keys it by name)."""
    def set_attr(text: str, attr: int, value: bool) -> None:
        token_id = token_to_id.get(text)
        if token_id is not None:
            attrs[token_id] = attrs[token_id] | attr if value else attrs[token_id] & ~attr

    if any(s in pre_text for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
            any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        set_attr("<mask>", Attr.LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        special_mask = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN
        for token_id, attr in enumerate(attrs):
            if attr & special_mask:
                attrs[token_id] = attr | Attr.RSTRIP
        set_attr("</s>", Attr.RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, Attr.RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", Attr.LSTRIP, True)


def _charsmap(metadata: Mapping[str, object]) -> bytes:
    values = _get_array(metadata, "tokenizer.ggml.precompiled_charsmap")
    if values is None:
        return b""
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype not in (np.int8, np.uint8):
        raise TokenizerError("tokenizer.ggml.precompiled_charsmap should be an array of bytes")
    blob = array.astype(np.uint8).tobytes()
    if len(blob) < 4:
        raise TokenizerError("tokenizer.ggml.precompiled_charsmap is too small for its header")
    xcda_size = int.from_bytes(blob[:4], "little")
    if xcda_size + 4 >= len(blob):
        raise TokenizerError("tokenizer.ggml.precompiled_charsmap: header points past its end")
    return blob
