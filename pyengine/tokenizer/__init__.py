"""Tokenizers for every GGUF vocabulary family, matching llama.cpp token for token.

    from pyengine.tokenizer import Tokenizer, StreamDecoder
    tok = Tokenizer.from_gguf("model.gguf")
    ids = tok.encode("Hello", add_special=True)
    text = tok.decode(ids)

Families (tokenizer.ggml.model): ``llama`` (SentencePiece: spm.py), ``gpt2`` and
``gemma4`` (BPE with a pre-tokenizer chosen by tokenizer.ggml.pre: bpe.py,
pretokenizers.py), ``bert`` (WordPiece: wpm.py), ``t5`` (Unigram: ugm.py).
"""

from pyengine.tokenizer.stream import StreamDecoder
from pyengine.tokenizer.tokenizer import Tokenizer

__all__ = ["Tokenizer", "StreamDecoder"]
