"""`Tokenizer`: text <-> token ids for any GGUF vocabulary, exactly as llama.cpp does it."""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Mapping

import regex

from pyengine.errors import TokenizerError
from pyengine.tokenizer.decode import PieceTable
from pyengine.tokenizer.special import Fragment, SpecialSplitter
from pyengine.tokenizer.vocab import Attr, Vocab


class Tokenizer:
    """A GGUF vocabulary's tokenizer (SentencePiece, byte-level BPE, WordPiece or Unigram)."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.n_vocab: int = vocab.n_vocab
        special = vocab.special
        self.bos_id: int | None = special["bos"]
        self.eos_id: int | None = special["eos"]
        self.eot_id: int | None = special["eot"]
        self.pad_id: int | None = special["pad"]
        self.unk_id: int | None = special["unk"]
        self.sep_id: int | None = special["sep"]
        self.add_bos: bool = vocab.flags.add_bos
        self.add_eos: bool = vocab.flags.add_eos
        self.eog_ids: frozenset[int] = vocab.eog_ids
        self._encoder = _make_encoder(vocab)
        self._pieces = PieceTable(vocab)
        self._splitters: dict[bool, SpecialSplitter] = {}

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, object]) -> Tokenizer:
        """Build from GGUF metadata (tokenizer.ggml.* keys, plus general.name)."""
        return cls(Vocab.from_metadata(metadata))

    @classmethod
    def from_gguf(cls, path_or_gguffile: object) -> Tokenizer:
        """Build from a GGUF file (a path, or an open pyengine.gguf.GGUFFile)."""
        from pyengine.gguf import GGUFFile

        if isinstance(path_or_gguffile, GGUFFile):
            return cls.from_metadata(path_or_gguffile.metadata)
        if not isinstance(path_or_gguffile, (str, os.PathLike)):
            raise TypeError("from_gguf takes a path or a pyengine.gguf.GGUFFile")
        gguf = GGUFFile(path_or_gguffile)
        try:
            return cls.from_metadata(gguf.metadata)
        finally:
            gguf.close()

    # -- encoding -----------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Token ids of `text`.

        add_special: add BOS/EOS (or CLS/SEP) as the vocabulary's metadata asks.
        parse_special: recognise control tokens written in the text (``<|im_end|>``);
        user-defined tokens are always recognised, as in llama.cpp.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode takes a str, not {type(text).__name__} (decode bytes "
                                 "first, e.g. data.decode('utf-8', 'replace'))")
        text = _without_surrogates(text)
        fragments = self._special_splitter(parse_special).split(text)
        family = self.vocab.family
        out = []
        if add_special and (self.add_bos or family == "wpm"):
            out.append(self._required("bos"))
        out += self._encode_fragments(fragments)
        if add_special and family == "wpm":
            out.append(self._required("sep"))
        elif add_special and self.add_eos:
            out.append(self._required("eos"))
        return out

    def _encode_fragments(self, fragments: list[Fragment]) -> list[int]:
        """Raw text and special ids (from the special-token splitter) to ids."""
        flags = self.vocab.flags
        family = self.vocab.family
        if family == "spm":
            return self._encoder.encode_fragments(fragments, flags.add_space_prefix)
        if family == "bpe":
            return self._encoder.encode_fragments(fragments, flags.escape_whitespaces)
        out: list[int] = []
        encode = self._encoder.encode
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
            else:
                out += encode(fragment)
        return out

    def _special_splitter(self, parse_special: bool) -> SpecialSplitter:
        splitter = self._splitters.get(parse_special)
        if splitter is None:
            # Control and unknown tokens only when asked; user-defined ones always.
            wanted = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN
            excluded = 0 if parse_special else Attr.CONTROL | Attr.UNKNOWN
            ids = [i for i, attr in enumerate(self.vocab.attrs)
                   if attr & wanted and not attr & excluded]
            splitter = self._splitters[parse_special] = SpecialSplitter(self.vocab, ids)
        return splitter

    def _required(self, name: str) -> int:
        token_id = self.vocab.special[name]
        if token_id is None:
            raise TokenizerError(f"this vocabulary has no {name} token to add")
        return token_id

    # -- decoding -----------------------------------------------------------------------

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 become U+FFFD.

        skip_special drops control tokens (and a leading BOS / trailing EOS the
        vocabulary adds). The space a SentencePiece vocabulary puts before the text is
        removed from the first token, so that decode(encode(text)) == text.
        """
        ids = self._checked_ids(ids)
        flags = self.vocab.flags
        if skip_special:
            if ids and self.add_bos and ids[0] == self.bos_id:
                ids = ids[1:]
            if ids and self.add_eos and ids[-1] == self.eos_id:
                ids = ids[:-1]
        pieces = self._pieces.table(special=not skip_special)
        data = b"".join([pieces[i] for i in ids])
        if flags.add_space_prefix and ids and pieces[ids[0]][:1] == b" ":
            data = data[1:]
        return data.decode("utf-8", "replace")

    def token_to_bytes(self, id: int) -> bytes:  # noqa: A002 - the public name
        """The bytes a token stands for (control tokens: their text)."""
        return self._pieces.table(special=True)[self._checked_id(id)]

    def token_text(self, id: int) -> str:  # noqa: A002
        """The vocabulary string as stored (▁ and GPT-2 byte characters included)."""
        return self.vocab.tokens[self._checked_id(id)]

    def is_control(self, id: int) -> bool:  # noqa: A002
        return bool(self.vocab.attrs[self._checked_id(id)] & Attr.CONTROL)

    def is_eog(self, id: int) -> bool:  # noqa: A002
        return id in self.eog_ids

    def piece_table(self, special: bool) -> list[bytes]:
        """Bytes of every token (control tokens as text when `special`, else empty)."""
        return self._pieces.table(special=special)

    def _checked_id(self, token_id: object) -> int:
        if type(token_id) is not int:
            try:
                if isinstance(token_id, bool):
                    raise TypeError
                token_id = operator.index(token_id)  # numpy integers too, no floats or strings
            except TypeError:
                raise TokenizerError(f"token ids are integers, got {token_id!r}") from None
        if not 0 <= token_id < self.n_vocab:
            raise TokenizerError(f"token id {token_id} is out of range [0, {self.n_vocab})")
        return token_id

    def _checked_ids(self, ids: Iterable[int]) -> list[int]:
        if isinstance(ids, (str, bytes)):
            raise TokenizerError("decode takes an iterable of token ids")
        ids = list(ids)
        n = self.n_vocab
        if not all(type(i) is int and 0 <= i < n for i in ids):
            ids = [self._checked_id(i) for i in ids]
        return ids

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.vocab.model!r}, n_vocab={self.n_vocab}, "
                f"pre={self.vocab.pre.name if self.vocab.pre else None!r})")


def _make_encoder(vocab: Vocab):
    if vocab.family == "spm":
        from pyengine.tokenizer.spm import SPMEncoder
        return SPMEncoder(vocab)
    if vocab.family == "bpe":
        from pyengine.tokenizer.bpe import BPEEncoder
        return BPEEncoder(vocab)
    if vocab.family == "wpm":
        from pyengine.tokenizer.wpm import WPMEncoder
        return WPMEncoder(vocab)
    from pyengine.tokenizer.ugm import UGMEncoder
    return UGMEncoder(vocab)


_SURROGATE = regex.compile("[\ud800-\udfff]")


def _without_surrogates(text: str) -> str:
    """Lone surrogates are no valid text: each becomes U+FFFD, as invalid UTF-8 does."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text
