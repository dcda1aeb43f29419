"""Fill-in-the-middle prompts, built as llama.cpp's server builds them for ``/infill``
(``format_prompt_infill``), for code models whose vocabulary has FIM tokens
(Qwen2.5-Coder, CodeLlama, StarCoder, DeepSeek-Coder, Codestral, ...)::

    [extra]  BOS?  FIM_PRE prefix prompt  FIM_SUF suffix  FIM_MID

`extra` is the repository-level context of the Qwen2.5-Coder report
(arXiv 2409.12186), present when the vocabulary has the tokens::

    FIM_REP "myproject\\n"  (FIM_SEP "<filename>\\n" <text>)...  FIM_SEP "filename\\n"

(without FIM_SEP each chunk is preceded by ``"\\n\\n--- snippet ---\\n\\n"`` instead).
The texts are tokenized without BOS/EOS and without reading special tokens in them;
the `prompt` (text after the cursor's prefix, as llama.vim sends it) is tokenized with
special tokens read. With `spm` the suffix part comes first (SUF suffix PRE prefix
prompt MID), as ``--spm-infill`` does.

The budget is llama.cpp's, for one batch of `n_batch` tokens: the prefix keeps its last
``3 * (n_batch // 4)`` tokens, the suffix its first ``n_batch // 4 - 2 - len(prompt)``,
the extra context its last ``n_ctx - n_batch - 2 * n_predict`` (0 or more). One guard
llama.cpp leaves to its context shift: the extra context (then the prefix's start, then
the suffix's end) is cut further so that the prompt leaves `n_predict` tokens (at least
one) of the context free.

A model generates the middle and ends it with an end-of-generation token: EOS/EOT or
FIM_PAD, FIM_REP, FIM_SEP, all in the vocabulary's end-of-generation set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pyengine.errors import InvalidOptionError

# The context llama.cpp adds; its tokens are tokenized like the rest.
REPO_NAME = "myproject\n"
CURRENT_FILE = "filename\n"
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
DEFAULT_FILENAME = "tmp"
DEFAULT_BATCH = 2048   # llama-server's n_batch
MAX_EXTRA_CHUNKS = 1024


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle tokens (None where it has none)."""

    pre: int
    suf: int
    mid: int
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None

    @classmethod
    def of(cls, special: Mapping[str, int | None]) -> "FimTokens | None":
        """The FIM tokens of `special` (``Vocab.special``), None unless it has PRE, SUF and MID."""
        pre, suf, mid = special.get("fim_pre"), special.get("fim_suf"), special.get("fim_mid")
        if pre is None or suf is None or mid is None:
            return None
        return cls(pre, suf, mid, special.get("fim_pad"), special.get("fim_rep"), special.get("fim_sep"))


@dataclass(frozen=True)
class ExtraChunk:
    """One file of context for the completion (llama.cpp's ``input_extra`` item)."""

    text: str
    filename: str = DEFAULT_FILENAME


def read_extra(items: Any) -> list[ExtraChunk]:
    """``input_extra`` (a list of ``{"text", "filename"?}``) checked, as llama.cpp checks it."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise InvalidOptionError('"input_extra" must be an array of {"filename": string, "text": string}')
    if len(items) > MAX_EXTRA_CHUNKS:
        raise InvalidOptionError(f'"input_extra" has {len(items)} chunks; at most {MAX_EXTRA_CHUNKS} are read')
    chunks = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise InvalidOptionError('extra_context chunk must contain a "text" field with a string value')
        filename = item.get("filename", DEFAULT_FILENAME)
        if not isinstance(filename, str):
            raise InvalidOptionError('extra_context chunk\'s "filename" field must be a string')
        chunks.append(ExtraChunk(item["text"], filename))
    return chunks


def infill_ids(tokenizer: Any, prefix: str, suffix: str, *, extra: Sequence[ExtraChunk] = (), prompt: str = "",
               n_ctx: int, n_batch: int = DEFAULT_BATCH, n_predict: int = -1, spm: bool = False) -> list[int]:
    """The token ids of a fill-in-the-middle prompt (see the module docs)."""
    fim = FimTokens.of(tokenizer.vocab.special)
    if fim is None:
        raise InvalidOptionError("the model's vocabulary has no fill-in-the-middle tokens")

    def text_ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special=False, parse_special=False)

    prefix_ids, suffix_ids = text_ids(prefix), text_ids(suffix)
    prompt_ids = tokenizer.encode(prompt, add_special=False, parse_special=True) if prompt else []
    extra_ids = _extra_ids(fim, extra, text_ids)

    n_prefix = min(len(prefix_ids), 3 * (n_batch // 4))
    n_suffix = min(len(suffix_ids), max(0, n_batch // 4 - (2 + len(prompt_ids))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []

    # the guard: leave n_predict tokens (at least one) of the context to the answer
    over = len(bos) + 3 + len(prompt_ids) + n_extra + n_prefix + n_suffix + max(n_predict, 1) - n_ctx
    n_extra, over = _shrink(n_extra, over)
    n_prefix, over = _shrink(n_prefix, over)
    n_suffix, over = _shrink(n_suffix, over)

    prefix_part = [fim.pre, *prefix_ids[len(prefix_ids) - n_prefix:], *prompt_ids]
    suffix_part = [fim.suf, *suffix_ids[:n_suffix]]
    first, second = (suffix_part, prefix_part) if spm else (prefix_part, suffix_part)
    extra_part = extra_ids[len(extra_ids) - n_extra:]
    return [*extra_part, *bos, *first, *second, fim.mid]


def _shrink(n: int, over: int) -> tuple[int, int]:
    """`n` less what it can give of `over`, and what is still over."""
    cut = min(max(over, 0), n)
    return n - cut, over - cut


def _extra_ids(fim: FimTokens, extra: Sequence[ExtraChunk], text_ids) -> list[int]:
    ids: list[int] = []
    if fim.rep is not None:
        ids += [fim.rep, *text_ids(REPO_NAME)]
    for chunk in extra:
        if fim.sep is not None:
            ids += [fim.sep, *text_ids(chunk.filename + "\n")]
        else:
            ids += text_ids(SNIPPET_SEPARATOR)
        ids += text_ids(chunk.text)
    if fim.sep is not None:
        ids += [fim.sep, *text_ids(CURRENT_FILE)]
    return ids


__all__ = ["DEFAULT_BATCH", "ExtraChunk", "FimTokens", "infill_ids", "read_extra"]
