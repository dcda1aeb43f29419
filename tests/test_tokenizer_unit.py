"""Tokenizer behaviour on small synthetic vocabularies: errors, special tokens, decoding."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tokenizer_vocabs import CONTROL, NORMAL, USER_DEFINED, bpe_metadata, spm_metadata

from pyengine.errors import TokenizerError
from pyengine.tokenizer import StreamDecoder, Tokenizer
from pyengine.tokenizer.pretokenizers import PRE_TOKENIZERS
from pyengine.tokenizer import special
from pyengine.tokenizer.special import SpecialSplitter
from pyengine.tokenizer.vocab import Attr, Vocab

# ---- bad vocabularies ---------------------------------------------------------------------


def test_unknown_model_is_named():
    with pytest.raises(TokenizerError, match="'rwkv9'"):
        Tokenizer.from_metadata(spm_metadata(**{"tokenizer.ggml.model": "rwkv9"}))


def test_unknown_pre_tokenizer_is_named():
    with pytest.raises(TokenizerError, match="'my-new-pre'"):
        Tokenizer.from_metadata(bpe_metadata(pre="my-new-pre"))


def test_arrays_of_different_lengths():
    meta = spm_metadata()
    meta["tokenizer.ggml.scores"] = meta["tokenizer.ggml.scores"][:-1]
    with pytest.raises(TokenizerError, match="scores has .* entries"):
        Tokenizer.from_metadata(meta)
    meta = spm_metadata()
    meta["tokenizer.ggml.token_type"] = np.concatenate([meta["tokenizer.ggml.token_type"], [1]])
    with pytest.raises(TokenizerError, match="token_type"):
        Tokenizer.from_metadata(meta)


@pytest.mark.parametrize("key", ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                 "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id"])
def test_special_id_out_of_range(key):
    meta = spm_metadata()
    meta[key] = len(meta["tokenizer.ggml.tokens"])
    with pytest.raises(TokenizerError, match="out of range"):
        Tokenizer.from_metadata(meta)


@pytest.mark.parametrize("meta", [
    {"tokenizer.ggml.tokens": ["a"]},                                   # no model
    spm_metadata(**{"tokenizer.ggml.tokens": []}),                      # no tokens
    spm_metadata(**{"tokenizer.ggml.tokens": "abc"}),                   # not an array
    bpe_metadata(**{"tokenizer.ggml.merges": []}),                      # BPE without merges
    bpe_metadata(**{"tokenizer.ggml.model": "gemma4"}),                 # must add a BOS it lacks
    spm_metadata(**{"tokenizer.ggml.bos_token_id": 0xFFFFFFFF}),        # ... likewise
    spm_metadata(**{"tokenizer.ggml.add_bos_token": "yes"}),            # not a bool
    spm_metadata(**{"tokenizer.ggml.bos_token_id": 1.5}),               # not an id
])
def test_unusable_vocabularies(meta):
    with pytest.raises(TokenizerError):
        Tokenizer.from_metadata(meta)


def test_duplicate_tokens():
    meta = spm_metadata()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"][:-1] + ["▁a"]
    with pytest.raises(TokenizerError, match="duplicate token"):
        Tokenizer.from_metadata(meta)


def test_bad_ids_and_text():
    tok = Tokenizer.from_metadata(spm_metadata())
    for bad in ([tok.n_vocab], [-1], [1, 2, 10**9], ["1"], [1.5]):
        with pytest.raises(TokenizerError):
            tok.decode(bad)
    with pytest.raises(TokenizerError):
        tok.token_to_bytes(tok.n_vocab)
    with pytest.raises(TokenizerError):
        StreamDecoder(tok).push(-5)
    with pytest.raises(TokenizerError):
        tok.encode(b"bytes")  # type: ignore[arg-type]
    assert tok.decode(np.array([3, 4], dtype=np.int64)) == tok.decode([3, 4])


# ---- SentencePiece --------------------------------------------------------------------------


def spm_ids(tok: Tokenizer, *texts: str) -> list[int]:
    return [tok.vocab.token_to_id[t] for t in texts]


def test_spm_segmentation_and_byte_fallback():
    tok = Tokenizer.from_metadata(spm_metadata())
    assert tok.encode("ab c") == spm_ids(tok, "▁ab", "▁c")
    assert tok.encode("ab", add_special=True) == [1] + spm_ids(tok, "▁ab")
    # "é" has no token: its UTF-8 bytes come out as <0xC3> <0xA9>
    assert tok.encode("é") == spm_ids(tok, "▁", "<0xC3>", "<0xA9>")
    assert tok.decode(tok.encode("é ab 中")) == "é ab 中"
    assert tok.decode([1] + tok.encode("ab"), skip_special=True) == "ab"
    assert tok.decode([1] + tok.encode("ab")) == "<s> ab"  # llama.cpp's rendering


def test_spm_prefix_space_after_special_tokens():
    tok = Tokenizer.from_metadata(spm_metadata())
    # Every text fragment after a special token gets the prefix space, as in llama.cpp.
    assert tok.encode("ab</s>ab", parse_special=True) == spm_ids(tok, "▁ab", "</s>", "▁ab")
    # Without parse_special the control token is text.
    assert 2 not in tok.encode("ab</s>ab")


def test_spm_long_input_without_spaces_is_linear():
    tok = Tokenizer.from_metadata(spm_metadata())
    import time
    sizes, times = (20_000, 80_000), []
    for n in sizes:
        text = "abcab中" * (n // 6)
        start = time.perf_counter()
        ids = tok.encode(text)
        times.append(time.perf_counter() - start)
        assert tok.decode(ids) == text
    # 4x the input may not cost more than ~6x the time (a quadratic loop costs 16x).
    assert times[1] < 6 * times[0] + 0.05, times


# ---- BPE ------------------------------------------------------------------------------------


def test_bpe_merges_by_rank():
    tok = Tokenizer.from_metadata(bpe_metadata())  # "Ġ a" ranks before "a b"
    ids = tok.encode(" the abc")
    assert [tok.token_text(i) for i in ids] == ["Ġthe", "Ġa", "b", "c"]
    assert tok.decode(ids) == " the abc"
    tok = Tokenizer.from_metadata(bpe_metadata(["a b", "ab c", "Ġ a", "Ġ t", "h e", "Ġt he"]))
    assert [tok.token_text(i) for i in tok.encode(" the abc")] == ["Ġthe", "Ġ", "abc"]
    assert tok.encode("") == []
    assert tok.decode(tok.encode("multi\nline\t\ttext 😀")) == "multi\nline\t\ttext 😀"


def test_bpe_pieces_of_tokens_outside_the_byte_alphabet():
    """A byte-level token's bytes: its GPT-2 characters mapped back, and characters
    outside that alphabet (some vocabularies' added normal tokens) kept as their UTF-8,
    alone or beside mapped ones."""
    extra = [("€", NORMAL), ("Ġ€x", NORMAL), ("\u00e9Ġ", NORMAL), (" a", NORMAL), ("ĠĊ", NORMAL)]
    tok = Tokenizer.from_metadata(bpe_metadata(extra=extra))
    pieces = tok.piece_table(special=True)
    want = {"€": "€".encode(), "Ġ€x": " €x".encode(), "\u00e9Ġ": b"\xe9 ", " a": b" a", "ĠĊ": b" \n"}
    for text, piece in want.items():
        assert pieces[tok.vocab.token_to_id[text]] == piece, text


def test_bpe_user_defined_tokens_always_split():
    tok = Tokenizer.from_metadata(bpe_metadata(extra=[("<tool>", USER_DEFINED), ("<|im_end|>", NORMAL)]))
    tool = tok.vocab.token_to_id["<tool>"]
    end = tok.vocab.token_to_id["<|im_end|>"]
    assert tool in tok.encode("x<tool>y")
    # <|im_end|> is found by its text: control and end-of-generation, so only parsed on request
    assert tok.is_control(end) and tok.is_eog(end) and end in tok.eog_ids
    assert end not in tok.encode("x<|im_end|>")
    assert tok.encode("x<|im_end|>", parse_special=True)[-1] == end
    assert tok.decode(tok.encode("x<|im_end|>", parse_special=True), skip_special=True) == "x"


def test_pre_tokenizer_table_covers_the_issue():
    names = ["default", "llama-bpe", "llama3", "qwen2", "qwen35", "smollm", "gpt-2",
             "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon", "starcoder", "refact",
             "command-r", "mpt", "olmo", "stablelm2", "tekken", "phi-2", "gpt-4o"]
    for name in names:
        assert name in PRE_TOKENIZERS
        tok = Tokenizer.from_metadata(bpe_metadata(pre=name))
        text = "Hello World! 123 4567 naïve 東京 'll  \n\t x"
        assert tok.decode(tok.encode(text)) == text


# ---- special tokens -------------------------------------------------------------------------


C_SPACE = " \t\n\v\f\r"


def reference_partition(text: str, specials: list[tuple[int, str, int]]) -> list:
    """llama.cpp's tokenizer_st_partition, literally: token by token, longest first."""
    fragments: list = [("raw", 0, len(text))] if text else []
    for token_id, token, attr in specials:
        out: list = []
        for frag in fragments:
            if frag[0] != "raw":
                out.append(frag)
                continue
            _, start, end = frag
            while True:
                match = text.find(token, start, end)
                if match < 0:
                    if end > start:
                        out.append(("raw", start, end))
                    break
                left_end = match
                if attr & Attr.LSTRIP:
                    while left_end > start and text[left_end - 1] in C_SPACE:
                        left_end -= 1
                if left_end > start:
                    out.append(("raw", start, left_end))
                out.append(("tok", token_id))
                start = match + len(token)
                if attr & Attr.RSTRIP:
                    while start < end and text[start] in C_SPACE:
                        start += 1
        fragments = out
    return [text[f[1]:f[2]] if f[0] == "raw" else f[1] for f in fragments]


@pytest.mark.parametrize("flat", [False, True], ids=["trie", "alternation"])
@pytest.mark.parametrize("seed", range(40))
def test_special_partition_matches_llama_cpp_order(seed, flat, monkeypatch):
    if flat:   # the pattern a vocabulary gets whose special tokens nest too deeply for the trie
        monkeypatch.setattr(special, "_MAX_TRIE_NESTING", 0)
    rng = random.Random(seed)
    alphabet = "ab \n"
    texts = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
                    for _ in range(rng.randint(1, 6))})
    strip = seed % 3 == 0
    extra = {t: (0.0, USER_DEFINED) for t in texts}
    meta = spm_metadata(extra={k: v for k, v in extra.items() if k not in ("a", "b")})
    vocab = Vocab.from_metadata(meta)
    ids = [vocab.token_to_id[t] for t in texts if t in vocab.token_to_id
           and vocab.attrs[vocab.token_to_id[t]] & Attr.USER_DEFINED]
    if strip:
        for i in ids:
            vocab.attrs[i] |= rng.choice([Attr.LSTRIP, Attr.RSTRIP, Attr.LSTRIP | Attr.RSTRIP])
    splitter = SpecialSplitter(vocab, ids)
    ordered = sorted(ids, key=lambda i: (-len(vocab.tokens[i]), i))
    specials = [(i, vocab.tokens[i], vocab.attrs[i]) for i in ordered]
    for _ in range(60):
        text = "".join(rng.choice(alphabet + "c") for _ in range(rng.randint(0, 30)))
        assert splitter.split(text) == reference_partition(text, specials), (text, texts)


def special_splitter(texts: list[str]) -> tuple[SpecialSplitter, list]:
    """A splitter of user-defined tokens `texts` and llama.cpp's order of them."""
    vocab = Vocab.from_metadata(spm_metadata(extra={t: (0.0, USER_DEFINED) for t in texts}))
    ids = [vocab.token_to_id[t] for t in texts]
    ordered = sorted(ids, key=lambda i: (-len(vocab.tokens[i]), i))
    return SpecialSplitter(vocab, ids), [(i, vocab.tokens[i], vocab.attrs[i]) for i in ordered]


def test_long_and_deeply_nested_special_tokens():
    """A special token thousands of characters long, and a hundred and fifty tokens each
    a prefix of the next, are cut out as llama.cpp cuts them: the trie pattern's build
    recursed once per character and past Python's limit on both."""
    long = "<" + "x" * 3000 + ">"
    splitter, specials = special_splitter([long, "<x"])
    for text in ("a" + long + "b" + long, long[:-1] + "<x" + long):
        assert splitter.split(text) == reference_partition(text, specials)
    chain = [("ab" * 80)[:n] for n in range(2, 152)]
    splitter, specials = special_splitter(chain)
    for text in ("ab" * 100 + "c", "b" + "ab" * 40 + "cab" * 3, "ab" * 30):
        assert splitter.split(text) == reference_partition(text, specials)


def test_overlapping_special_tokens_take_the_longer():
    tok = Tokenizer.from_metadata(spm_metadata(extra={"ab": (0.0, USER_DEFINED),
                                                      "bcd": (0.0, USER_DEFINED)}))
    ab, bcd = tok.vocab.token_to_id["ab"], tok.vocab.token_to_id["bcd"]
    ids = tok.encode("abcd")
    assert bcd in ids and ab not in ids  # "bcd" is longer, so it is cut out first


# ---- decoding and streaming -------------------------------------------------------------------


def test_stream_decoder_holds_back_partial_utf8():
    tok = Tokenizer.from_metadata(spm_metadata())
    e4, b8, ad = (tok.vocab.token_to_id[f"<0x{b:02X}>"] for b in (0xE4, 0xB8, 0xAD))
    stream = StreamDecoder(tok)
    assert [stream.push(i) for i in (e4, b8, ad)] == ["", "", "中"]
    assert stream.push(e4) == "" and stream.flush() == "\ufffd"
    # a byte that can never start a character comes out at once
    assert stream.push(tok.vocab.token_to_id["<0xFF>"]) == "\ufffd"
    assert tok.decode([e4, b8]) == "\ufffd"


def test_stream_decoder_skip_special():
    tok = Tokenizer.from_metadata(spm_metadata())
    ab = tok.vocab.token_to_id["▁ab"]
    assert "".join(StreamDecoder(tok).push(i) for i in (1, ab, 2)) == "<s> ab</s>"
    assert "".join(StreamDecoder(tok, skip_special=True).push(i) for i in (1, ab, 2)) == " ab"


def test_surrogates_nul_and_control_characters():
    for meta in (spm_metadata(), bpe_metadata()):
        tok = Tokenizer.from_metadata(meta)
        assert tok.decode(tok.encode("a\ud800b")) == "a\ufffdb"
        assert tok.decode(tok.encode("a\0b\x01\x7f")) == "a\0b\x01\x7f"


def test_token_accessors():
    tok = Tokenizer.from_metadata(spm_metadata())
    ab = tok.vocab.token_to_id["▁ab"]
    assert tok.token_text(ab) == "▁ab" and tok.token_to_bytes(ab) == b" ab"
    assert tok.token_to_bytes(tok.vocab.token_to_id["<0x41>"]) == b"A"
    assert tok.token_to_bytes(1) == b"<s>" and tok.is_control(1) and not tok.is_control(ab)
    assert tok.is_eog(2) and not tok.is_eog(1)
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id, tok.add_bos, tok.add_eos) == \
        (1, 2, 0, None, True, False)


def mutated_vocabulary(rng: random.Random) -> dict:
    """An SPM or byte-level BPE vocabulary with a few random faults: odd, empty, long or
    duplicate tokens, special ids anywhere, bad token types, NaN scores, broken merges."""
    meta = spm_metadata() if rng.random() < 0.5 else bpe_metadata(pre=rng.choice(list(PRE_TOKENIZERS)))
    tokens = list(meta["tokenizer.ggml.tokens"])
    odd = ["", " ", "\x00", "x" * rng.choice([3, 700]), "<0xZZ>", "▁", "Ġ", "\u0301", "🙂", "<s>", "\n", "ab c"]
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.3:
            tokens[rng.randrange(len(tokens))] = rng.choice(odd)
        elif kind < 0.5:
            tokens.append(rng.choice(odd) + chr(rng.randint(0x100, 0x3000)))
        elif kind < 0.6:
            meta["tokenizer.ggml.token_type"] = np.array(meta["tokenizer.ggml.token_type"]).copy()
            meta["tokenizer.ggml.token_type"][rng.randrange(len(tokens) - 1)] = rng.choice([-1, 0, 4, 7, 100])
        elif kind < 0.7 and "tokenizer.ggml.scores" in meta:
            meta["tokenizer.ggml.scores"] = np.array(meta["tokenizer.ggml.scores"]).copy()
            meta["tokenizer.ggml.scores"][rng.randrange(len(tokens) - 1)] = rng.choice([np.nan, np.inf, -1e30])
        elif kind < 0.8 and "tokenizer.ggml.merges" in meta:
            meta["tokenizer.ggml.merges"] = [*meta["tokenizer.ggml.merges"], rng.choice(["a", "a b c", " a", "x y"])]
        else:
            key = rng.choice(["bos", "eos", "unknown", "padding", "eot"])
            meta[f"tokenizer.ggml.{key}_token_id"] = rng.randrange(len(tokens) + 2)
    extra = len(tokens) - len(meta["tokenizer.ggml.tokens"])
    for key, fill in (("tokenizer.ggml.token_type", USER_DEFINED), ("tokenizer.ggml.scores", -9.0)):
        if key in meta and extra:
            meta[key] = np.concatenate([meta[key], np.full(extra, fill, np.asarray(meta[key]).dtype)])
    meta["tokenizer.ggml.tokens"] = tokens
    return meta


def test_mutated_vocabularies_work_or_fail_with_tokenizer_errors():
    """Seeded faulty vocabularies: each is refused with a TokenizerError, or encodes and
    decodes any text (with and without special tokens) raising nothing else."""
    built = 0
    texts = ["", "Hello world", "a" * 800, "x" * 700 + "<s>", "naïve 🙂\u0301 東京\n\n  \t", "<s>ab c</s>\x00"]
    for seed in range(150):
        rng = random.Random(seed)
        try:
            tok = Tokenizer.from_metadata(mutated_vocabulary(rng))
        except TokenizerError:
            continue
        built += 1
        for text in texts:
            ids = tok.encode(text, add_special=True, parse_special=rng.random() < 0.7)
            tok.decode(ids)
            tok.decode([rng.randrange(tok.n_vocab) for _ in range(20)], skip_special=True)
    assert built > 50


@pytest.mark.parametrize("make", [spm_metadata, bpe_metadata], ids=["spm", "bpe"])
def test_piece_tables_do_not_depend_on_which_is_built_first(make):
    """The table with control-token text and the one without are built once and derived
    from each other; either way round they equal tables built alone."""
    meta = make(extra={"<ctl>": (0.0, CONTROL), "<usr>": (0.0, USER_DEFINED)} if make is spm_metadata
                else [("<ctl>", CONTROL), ("<usr>", USER_DEFINED)])
    alone = {special: Tokenizer.from_metadata(meta).piece_table(special) for special in (False, True)}
    for first in (False, True):
        tok = Tokenizer.from_metadata(meta)
        tables = {first: tok.piece_table(first), not first: tok.piece_table(not first)}
        assert tables == alone
    ctl, usr = (tok.vocab.token_to_id[t] for t in ("<ctl>", "<usr>"))
    assert alone[True][ctl] == b"<ctl>" and alone[False][ctl] == b"" and alone[False][usr] == b"<usr>"
