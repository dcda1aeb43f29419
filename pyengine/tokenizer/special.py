"""Cutting special tokens out of text before the tokenizer proper sees it.

llama.cpp takes the special tokens longest first and, for each, cuts every occurrence
out of the text that is still raw, left to right. That order matters where
occurrences overlap ("ab" and "bcd" in "abcd": "bcd" wins). Doing it token by token
costs O(tokens x text); here a trie-shaped regex finds, at each position, the longest
special token, and the cheap leftmost-longest scan is used whenever it provably gives
llama.cpp's answer: when no higher-priority token can start inside a match. Otherwise
(and for tokens that strip the whitespace around them) the exact priority-ordered
selection runs over all occurrences.
"""

from __future__ import annotations

from collections.abc import Iterable

import re

from pyengine.tokenizer.vocab import Attr, Vocab

# C isspace() in the "C" locale: what lstrip/rstrip remove next to a special token.
_C_SPACE = frozenset(" \t\n\v\f\r")

Fragment = str | int  # raw text, or the id of a special token cut out of it


class SpecialSplitter:
    """Splits text into raw fragments and special token ids, as llama.cpp does."""

    def __init__(self, vocab: Vocab, token_ids: Iterable[int]) -> None:
        tokens = vocab.tokens
        # llama.cpp's order: longer first (ties: lower id, a stable choice of ours).
        ordered = sorted(token_ids, key=lambda i: (-len(tokens[i]), i))
        self._texts = {tokens[i]: i for i in ordered}
        self._rank = {i: r for r, i in enumerate(ordered)}
        self._strip = {i: vocab.attrs[i] & (Attr.LSTRIP | Attr.RSTRIP) for i in ordered
                       if vocab.attrs[i] & (Attr.LSTRIP | Attr.RSTRIP)}
        # one compiled pattern: its group is what split() keeps; matches read group 0, the
        # same with or without it.  The standard library's re compiles it (nothing here
        # needs the regex module) in a quarter of the time: Gemma-3's 6414 tokens ~30 ms.
        self._pattern = re.compile(f"({_trie_pattern(self._texts)})") if ordered else None
        self._prefixes = _special_prefixes(self._texts)
        self._risky = _risky_tokens(self._texts, self._rank)
        self._risky_texts = frozenset(tokens[i] for i in self._risky)

    def split(self, text: str) -> list[Fragment]:
        if self._pattern is None or not text:
            return [text] if text else []
        # Leftmost-longest matches, alternating with the raw text around them (maybe "").
        parts = self._pattern.split(text)
        if len(parts) == 1:
            return [text]
        if self._strip or not self._leftmost_longest_is_exact(text, parts):
            spans, taken = self._priority_spans(text)
            return self._fragments(text, spans, taken)
        texts = self._texts
        return [texts[part] if i & 1 else part for i, part in enumerate(parts) if part]

    # -- the fast path ------------------------------------------------------------------

    def _leftmost_longest_is_exact(self, text: str, parts: list[str]) -> bool:
        """True when no higher-priority token starts inside any leftmost-longest match.

        Then every match outranks everything overlapping it, so llama.cpp's order picks
        exactly these matches.
        """
        risky = self._risky_texts
        if risky.isdisjoint(parts[1::2]):
            return True
        match, texts, rank = self._pattern.match, self._texts, self._rank
        start = 0
        for i, part in enumerate(parts):
            end = start + len(part)
            if i & 1 and part in risky:
                own = rank[texts[part]]
                for inner in range(start + 1, end):
                    found = match(text, inner)
                    if found is not None and rank[texts[found.group()]] < own:
                        return False
            start = end
        return True

    # -- the exact path -----------------------------------------------------------------

    def _priority_spans(self, text: str) -> tuple[list[tuple[int, int]], bytearray]:
        """Every occurrence of every token, taken in llama.cpp's order when still free.

        Returns the chosen spans (sorted) and a map of the text: 1 inside a chosen token,
        2 on whitespace a token stripped from its side, 0 on raw text.
        """
        texts, rank, prefixes = self._texts, self._rank, self._prefixes
        occurrences = []  # (rank, start, end, id)
        for m in _overlapped(self._pattern, text):
            start, longest = m.start(), m.group()
            for tok in (longest, *prefixes.get(longest, ())):
                token_id = texts[tok]
                occurrences.append((rank[token_id], start, start + len(tok), token_id))
        occurrences.sort()
        taken = bytearray(len(text))
        spans = []
        for _, start, end, token_id in occurrences:
            if taken.find(1, start, end) != -1 or taken.find(2, start, end) != -1:
                continue
            taken[start:end] = b"\x01" * (end - start)
            spans.append((start, end))
            strip = self._strip.get(token_id, 0)
            if strip & Attr.LSTRIP:
                _mark_spaces(text, taken, start - 1, -1)
            if strip & Attr.RSTRIP:
                _mark_spaces(text, taken, end, 1)
        spans.sort()
        return spans, taken

    def _fragments(self, text: str, spans: list[tuple[int, int]],
                   taken: bytearray | None) -> list[Fragment]:
        texts = self._texts
        fragments: list[Fragment] = []
        last = 0
        for start, end in spans:
            self._add_raw(fragments, text, last, start, taken)
            fragments.append(texts[text[start:end]])
            last = end
        self._add_raw(fragments, text, last, len(text), taken)
        return fragments

    @staticmethod
    def _add_raw(fragments: list[Fragment], text: str, start: int, end: int,
                 taken: bytearray | None) -> None:
        if taken is not None:  # whitespace stripped by the neighbouring tokens is dropped
            while start < end and taken[start] == 2:
                start += 1
            while end > start and taken[end - 1] == 2:
                end -= 1
        if end > start:
            fragments.append(text[start:end])


def _mark_spaces(text: str, taken: bytearray, pos: int, step: int) -> None:
    """Mark the free C-whitespace run from `pos` in direction `step` as stripped."""
    while 0 <= pos < len(text) and not taken[pos] and text[pos] in _C_SPACE:
        taken[pos] = 2
        pos += step


# Groups a trie pattern may nest (one per token ending, or branching, along a token);
# past this the pattern is a plain alternation (see _trie_pattern).
_MAX_TRIE_NESTING = 100


def _trie_pattern(texts: Iterable[str]) -> str:
    """A regex matching the longest of `texts` at a position, shaped as a trie so that
    thousands of alternatives cost one character test per position.  A run of
    characters no other token ends or branches in is one literal, so a long token nests
    nothing; a vocabulary whose tokens nest deeper than _MAX_TRIE_NESTING (hundreds of
    tokens each a prefix of the next) gets the alternatives longest first instead,
    which the regex engine also takes as the longest match at a position."""
    texts = list(texts)
    trie: dict = {}
    for text in texts:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = True
    if _trie_nesting(trie) > _MAX_TRIE_NESTING:
        return "(?:" + "|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)) + ")"

    def build(node: dict) -> str:
        branches = []
        for ch, child in sorted(node.items()):
            if not ch:
                continue
            run = [ch]
            while len(child) == 1 and "" not in child:   # one way on, no token ending here
                (next_ch, child), = child.items()
                run.append(next_ch)
            branches.append(re.escape("".join(run)) + build(child))
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(trie)


def _overlapped(pattern: re.Pattern, text: str):
    """The pattern's match at every position where one starts (overlapping ones too)."""
    found = pattern.search(text)
    while found is not None:
        yield found
        found = pattern.search(text, found.start() + 1)


def _trie_nesting(trie: dict) -> int:
    """The most nodes that end a token or branch on any path of the trie: how deeply
    _trie_pattern's build recurses and its groups nest (counted without recursing)."""
    deepest, stack = 0, [(trie, 0)]
    while stack:
        node, depth = stack.pop()
        depth += "" in node or len(node) > 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for ch, child in node.items() if ch)
    return deepest


def _special_prefixes(texts: dict[str, int]) -> dict[str, tuple[str, ...]]:
    """For each special token, the other special tokens that are proper prefixes of it."""
    result = {}
    for text in texts:
        found = tuple(text[:n] for n in range(1, len(text)) if text[:n] in texts)
        if found:
            result[text] = found
    return result


def _risky_tokens(texts: dict[str, int], rank: dict[int, int]) -> set[int]:
    """Tokens inside whose occurrences a higher-priority token could start.

    Token B can start at offset d inside an occurrence of A when A[d:] and B agree on
    their common length (one is a prefix of the other). Runs of one character against
    longer runs of the same character are safe (see _is_run).
    """
    by_first: dict[str, list[str]] = {}
    for text in texts:
        by_first.setdefault(text[0], []).append(text)
    risky = set()
    for text, token_id in texts.items():
        own = rank[token_id]
        run = _is_run(text)
        for d in range(1, len(text)):
            rest = text[d:]
            if any(rank[texts[other]] < own and (other.startswith(rest) or rest.startswith(other))
                   and not (run and _is_run(other) and other[0] == text[0])
                   for other in by_first.get(rest[0], ())):
                risky.add(token_id)
                break
    return risky


def _is_run(text: str) -> bool:
    """One character repeated ("  ", "\n\n\n").

    A run token picked leftmost-longest is never overtaken by a longer run of the same
    character starting inside it: that longer run would have fit at the same start.
    """
    return text == text[0] * len(text)
