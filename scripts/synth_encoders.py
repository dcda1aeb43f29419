"""What the synthetic encoder models share (scripts/make_synth_bert.py and the
other encoder scripts): a small WordPiece vocabulary written the way llama.cpp's
converter writes BERT's (word starts marked with ▁, continuation pieces bare),
the GGUF writing (matrices Q8_0, everything else F32), and the recorder of
llama.cpp's embeddings.

The golden file tests/data/golden/synth/<stem>.json holds, per text, the token ids
llama.cpp's tokenizer gave ([CLS] ... [SEP] added), the per-token hidden states
(pooling none), the pooled vector with the file's pooling type, and, for a model
with a classification head, the rank score.  Nothing is normalized.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, PoolingType, TokenType, quants

ROOT = Path(__file__).resolve().parent.parent
SYNTH_DIR = ROOT / "tests" / "data" / "synth" / "encoders"
GOLDEN_DIR = ROOT / "tests" / "data" / "golden" / "synth"

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the a an of to and in is it that for on with as by at from this be are was not or but "
         "quick brown fox jump over lazy dog cat sat mat hello world embed model text search query "
         "document rank score vector token piece word night day light dark cafe naive resume "
         "rain snow sun moon river mountain city house book read write code data test run "
         "play learn teach small large new old good bad first last time year people way").split()
SUFFIXES = ["s", "es", "ed", "ing", "er", "est", "ly", "ion", "al", "ment", "ness", "ful"]
LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
PUNCT = list(".,;:!?'\"()[]{}-_/\\@#$%&*+=<>|~`^")
CJK = list("東京大学中文字日本語")

# recorded texts: punctuation, accents (stripped by the normalizer), CJK, unknown words,
# upper case, numbers; the live checks use other texts
TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "Naïve café résumé, ÉCOLE.",
    "東京大学 and 中文 text",
    "unknown zyxwv words: 🚀 qqqq ∑",
    "search_query: (first) [last] {rank}",
    "It was 2024; the rain, the snow... and 42 cats.",
    "a",
]
N_CTX_RECORD = 128

# a reranker's recorded query and documents (its live check ranks others)
RERANK_QUERY = "what does the quick brown fox jump over?"
RERANK_DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A cat sat on the mat.",
    "Rain and snow in the mountain city.",
    "The fox is quick and brown.",
    "Hello world!",
    "The lazy dog sleeps at night.",
    "Search the document for a word.",
    "Jumping over the dog, the fox ran to the river.",
]


def vocab() -> list[str]:
    """Specials, then every ASCII letter/digit and punctuation as a word start and as a
    continuation piece, the CJK characters, suffixes, and whole words."""
    tokens = list(SPECIALS)
    tokens += ["\u2581" + c for c in LETTERS] + list(LETTERS)
    tokens += ["\u2581" + c for c in PUNCT + CJK]
    tokens += SUFFIXES + ["\u2581" + w for w in WORDS]
    return list(dict.fromkeys(tokens))   # ("a" is a letter and a word): each once, first place kept


def add_wordpiece_tokenizer(writer: GGUFWriter, tokens: list[str]) -> None:
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    types = [TokenType.CONTROL if t in SPECIALS else TokenType.NORMAL for t in tokens]
    writer.add_token_types(types)
    writer.add_token_type_count(2)
    writer.add_bos_token_id(CLS)
    writer.add_sep_token_id(SEP)
    writer.add_unk_token_id(UNK)
    writer.add_pad_token_id(PAD)
    writer.add_mask_token_id(MASK)
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)


def start_encoder(path: Path, arch: str, *, name: str, n_layer: int, n_ctx: int, n_embd: int, n_ff: int,
                  n_head: int, eps: float, pooling: PoolingType) -> GGUFWriter:
    writer = GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_layer_norm_eps(eps)
    writer.add_causal_attention(False)
    writer.add_pooling_type(pooling)
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q8_0))
    return writer


def finish(writer: GGUFWriter, tokens: list[str], tensors: Iterable[tuple[str, np.ndarray]],
           f32: frozenset[str] = frozenset({"token_types.weight"})) -> None:
    """The tokenizer, then the tensors: matrices and expert stacks Q8_0 (except those
    named in f32), vectors F32."""
    add_wordpiece_tokenizer(writer, tokens)
    for name, data in tensors:
        data = np.ascontiguousarray(data, dtype=np.float32)
        if data.ndim >= 2 and name not in f32 and data.shape[-1] % 32 == 0:
            q8_0 = quants.quantize(data, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q8_0, raw_shape=q8_0.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class Random:
    """Seeded weights: matrices ~ 1/sqrt(fan-in), embeddings 0.5, norms 1 +- 0.1, biases 0.1."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def matrix(self, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        return gain * self.rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)

    def embedding(self, n: int, n_embd: int) -> np.ndarray:
        return 0.5 * self.rng.standard_normal((n, n_embd))

    def norm(self, n: int) -> np.ndarray:
        return 1.0 + 0.1 * self.rng.standard_normal(n)

    def bias(self, n: int) -> np.ndarray:
        return 0.1 * self.rng.standard_normal(n)


def bert_embeddings(r: Random, n_vocab: int, n_embd: int) -> dict:
    """Token and token-type embeddings and the LayerNorm after them (BERT's and its kin's)."""
    return {"token_embd.weight": r.embedding(n_vocab, n_embd),
            "token_types.weight": r.embedding(2, n_embd),
            "token_embd_norm.weight": r.norm(n_embd), "token_embd_norm.bias": r.bias(n_embd)}


def fused_qkv(r: Random, n_embd: int, qk_gain: float = 2.0) -> np.ndarray:
    """A fused q/k/v projection [3 n_embd, n_embd]; q and k `qk_gain` times larger, so that
    attention is sharper than uniform over short texts."""
    return np.concatenate([r.matrix(n_embd, n_embd, qk_gain), r.matrix(n_embd, n_embd, qk_gain),
                           r.matrix(n_embd, n_embd)])


def record(model: Path, out: Path, pooling: str, rank: bool, texts: list[str] = TEXTS) -> None:
    """llama.cpp's embeddings of `texts` (see the module's docstring)."""
    from llama_cpp import LLAMA_POOLING_TYPE_CLS, LLAMA_POOLING_TYPE_MEAN, LLAMA_POOLING_TYPE_NONE, \
        LLAMA_POOLING_TYPE_RANK, Llama

    kinds = {"none": LLAMA_POOLING_TYPE_NONE, "mean": LLAMA_POOLING_TYPE_MEAN, "cls": LLAMA_POOLING_TYPE_CLS,
             "rank": LLAMA_POOLING_TYPE_RANK}

    def load(kind: str) -> Llama:
        return Llama(str(model), embedding=True, pooling_type=kinds[kind], n_ctx=N_CTX_RECORD,
                     n_batch=N_CTX_RECORD, n_ubatch=N_CTX_RECORD, n_threads=2, verbose=False)

    per_token = load("none")
    pooled = load(pooling)
    cases = []
    for text in texts:
        case = {"text": text, "tokens": per_token.tokenize(text.encode("utf-8")),
                "hidden": per_token.embed(text), "pooled": pooled.embed(text)}
        cases.append(case)
    golden = {"model": model.name, "pooling": pooling, "recorder": "llama-cpp-python " + _llama_cpp_version(),
              "cases": cases}
    if rank:
        ranker = load("rank")
        for case in cases:
            case["rank"] = ranker.embed(case["text"])[:1]
        golden["rerank"] = record_rerank(ranker, RERANK_QUERY, RERANK_DOCUMENTS)
    out.write_text(json.dumps(_rounded(golden)) + "\n")


def record_rerank(ranker, query: str, documents: list[str]) -> dict:
    """llama.cpp's scores of `query` against each of `documents`, every pair's
    tokens laid out as llama-server lays them out for a model without a rerank template
    ([BOS] query [EOS] [SEP] document [EOS], each marker where the vocabulary adds it)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(ranker._model.model)
    bos = [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
    eos = [llama_cpp.llama_vocab_eos(vocab)] if llama_cpp.llama_vocab_get_add_eos(vocab) else []
    sep = [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []

    def pieces(text: str) -> list[int]:
        return ranker.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    pairs = [bos + pieces(query) + eos + sep + pieces(doc) + eos for doc in documents]
    return {"query": query, "documents": documents, "tokens": pairs,
            "scores": [_rank_score(ranker, ids) for ids in pairs]}


def _rank_score(ranker, ids: list[int]) -> float:
    """The rank output of one sequence of token ids (Llama.embed takes only text)."""
    import llama_cpp

    ranker._ctx.kv_cache_clear()
    ranker._batch.reset()
    ranker._batch.add_sequence(ids, 0, True)
    ranker._ctx.decode(ranker._batch)
    score = float(llama_cpp.llama_get_embeddings_seq(ranker._ctx.ctx, 0)[0])
    ranker._batch.reset()
    ranker._ctx.kv_cache_clear()
    return score


def _rounded(value):
    """float32's 7 significant digits, not double's 17 (the file stays small)."""
    if isinstance(value, float):
        return float(f"{value:.7g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def _llama_cpp_version() -> str:
    import llama_cpp

    return llama_cpp.__version__


def main(argv: list[str], doc: str, stem: str, write_model: Callable[[Path], None], pooling: str, rank: bool) -> None:
    """Write the encoder `stem` with write_model(path) and, with --record, record its golden
    file (record(model, golden, pooling, rank)) with llama.cpp."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="also record the golden file with llama.cpp")
    args = parser.parse_args(argv)
    SYNTH_DIR.mkdir(parents=True, exist_ok=True)
    model, golden = SYNTH_DIR / f"{stem}.gguf", GOLDEN_DIR / f"{stem}.json"
    write_model(model)
    print(f"{model.relative_to(ROOT)}: {model.stat().st_size} B")
    if args.record:
        record(model, golden, pooling, rank=rank)
        print(f"{golden.relative_to(ROOT)}: recorded with llama.cpp")
