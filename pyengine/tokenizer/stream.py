"""Incremental detokenization for generation: text out as soon as it is complete."""

from __future__ import annotations

import codecs

from pyengine.tokenizer.tokenizer import Tokenizer


class StreamDecoder:
    """Turns a stream of token ids into text, holding back incomplete UTF-8.

    A character split over several tokens (byte-fallback pieces, byte-level BPE) comes
    out with the token that completes it; bytes that can never form a character come
    out as U+FFFD. Each token's text is llama.cpp's piece: a SentencePiece word token
    keeps its leading space (the first generated word usually starts with one), and
    control tokens appear as their text unless skip_special is set.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._pieces = tokenizer.piece_table(special=not skip_special)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:  # noqa: A002 - the public name
        """Add one token; returns the text that is now complete (maybe "")."""
        if type(id) is not int or not 0 <= id < len(self._pieces):
            id = self._tokenizer._checked_id(id)
        return self._decoder.decode(self._pieces[id])

    def flush(self) -> str:
        """End of stream: whatever is held back, incomplete sequences as U+FFFD."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
