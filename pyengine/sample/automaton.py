"""Byte-level pushdown automaton for a parsed GBNF grammar.

Code-point classes are compiled to UTF-8 byte-range sequences, so the matcher steps one
byte at a time and a token that ends inside a multi-byte character simply leaves the
automaton in the middle of that character's sequence (partial UTF-8 needs no special case).

Program: a flat array of elements; each alternative of each rule is a run of elements
ending with END. An element is END, BYTES (a 256-bit mask of acceptable bytes) or REF (a
rule id). A stack is a tuple of element positions, top last; every stack in a state has a
BYTES element on top, except the empty stack, which means "the root rule is complete".
States (frozensets of stacks) are interned to ints and their transitions cached.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

from pyengine.errors import GrammarError
from pyengine.sample.gbnf import MAX_CODE_POINT, Item, ParsedGrammar

END, BYTES, REF = 0, 1, 2
DEAD = -1
MAX_STATES = 50_000        # cached states before the cache is dropped and rebuilt lazily
# Stacks in one state: beyond this the grammar is too ambiguous.  A step costs about 25 us
# a stack in Python, so this bounds a byte at ~50 ms; the schema and GBNF grammars of the
# tests reach 44 at most, while nested repetitions ("x"+++++++++) multiply them per byte.
MAX_STACKS = 2_000

_SURROGATES = (0xD800, 0xDFFF)
_serial_numbers = itertools.count()
_UTF8_BOUNDS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CODE_POINT))


@dataclass(frozen=True)
class Program:
    kinds: tuple[int, ...]             # element kind per position
    args: tuple[int, ...]              # BYTES: byte mask; REF: rule id; END: 0
    alts: tuple[tuple[int, ...], ...]  # rule id -> start position of each alternative
    names: tuple[str, ...]             # rule id -> name (class rules: "<class>")
    root: int


# ---- compiling code-point classes to byte masks


def byte_range_mask(low: int, high: int) -> int:
    return ((1 << (high + 1)) - 1) ^ ((1 << low) - 1)


def _normalise(ranges: tuple[tuple[int, int], ...], negated: bool) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    if negated:
        complement, next_low = [], 0
        for low, high in merged:
            if low > next_low:
                complement.append([next_low, low - 1])
            next_low = high + 1
        if next_low <= MAX_CODE_POINT:
            complement.append([next_low, MAX_CODE_POINT])
        merged = complement
    # surrogates have no UTF-8 encoding: cut them out
    result = []
    for low, high in merged:
        if high < _SURROGATES[0] or low > _SURROGATES[1]:
            result.append((low, high))
            continue
        if low < _SURROGATES[0]:
            result.append((low, _SURROGATES[0] - 1))
        if high > _SURROGATES[1]:
            result.append((_SURROGATES[1] + 1, high))
    return result


def utf8_sequences(low: int, high: int) -> list[tuple[tuple[int, int], ...]]:
    """Split code points [low, high] into sequences of byte ranges (one range per byte)."""
    out: list[tuple[tuple[int, int], ...]] = []
    for bound_low, bound_high in _UTF8_BOUNDS:
        a, b = max(low, bound_low), min(high, bound_high)
        if a <= b:
            _split_same_length(a, b, out)
    return out


def _split_same_length(a: int, b: int, out: list) -> None:
    length = len(chr(a).encode("utf-8"))
    for i in range(1, length):
        low_bits = (1 << (6 * i)) - 1  # the bits carried by the last i continuation bytes
        if (a & ~low_bits) != (b & ~low_bits):
            if a & low_bits:
                _split_same_length(a, a | low_bits, out)
                _split_same_length((a | low_bits) + 1, b, out)
                return
            if (b & low_bits) != low_bits:
                _split_same_length(a, (b & ~low_bits) - 1, out)
                _split_same_length(b & ~low_bits, b, out)
                return
    out.append(tuple(zip(chr(a).encode("utf-8"), chr(b).encode("utf-8"))))


def class_to_masks(ranges: tuple[tuple[int, int], ...], negated: bool) -> list[tuple[int, ...]]:
    """A code-point class as alternatives, each a sequence of byte masks."""
    single = 0
    by_tail: dict[tuple[int, ...], int] = {}   # sequences sharing their tail merge their first byte
    for low, high in _normalise(ranges, negated):
        for sequence in utf8_sequences(low, high):
            masks = tuple(byte_range_mask(lo, hi) for lo, hi in sequence)
            if len(masks) == 1:
                single |= masks[0]
            else:
                by_tail[masks[1:]] = by_tail.get(masks[1:], 0) | masks[0]
    alternatives = [(single,)] if single else []
    alternatives += [(first, *tail) for tail, first in by_tail.items()]
    return alternatives or [(0,)]   # an empty class: a byte set nothing matches


# ---- compiling the parsed rules


def compile_program(parsed: ParsedGrammar) -> Program:
    return _Compiler(parsed).run()


class _Compiler:
    def __init__(self, parsed: ParsedGrammar) -> None:
        self.parsed = parsed
        self.kinds: list[int] = []
        self.args: list[int] = []
        self.alts: list[tuple[int, ...]] = []
        self.names: list[str] = list(parsed.names)
        self.class_rules: dict[tuple, int] = {}
        self.pending: list[tuple[int, list[tuple[int, ...]]]] = []

    def run(self) -> Program:
        self.alts = [()] * len(self.parsed.rules)
        for rule_id, alternatives in enumerate(self.parsed.rules):
            self.alts[rule_id] = tuple(self.emit_alternative(alt) for alt in alternatives)
        while self.pending:
            rule_id, mask_alternatives = self.pending.pop()
            self.alts[rule_id] = tuple(self.emit_masks(masks) for masks in mask_alternatives)
        return Program(tuple(self.kinds), tuple(self.args), tuple(self.alts), tuple(self.names),
                       self.parsed.root)

    def emit(self, kind: int, arg: int) -> int:
        self.kinds.append(kind)
        self.args.append(arg)
        return len(self.kinds) - 1

    def emit_alternative(self, items: list[Item]) -> int:
        start = len(self.kinds)
        for item in items:
            if item[0] == "ref":
                self.emit(REF, item[1])
                continue
            alternatives = self.class_alternatives(item[1], item[2])
            if len(alternatives) == 1:
                for mask in alternatives[0]:
                    self.emit(BYTES, mask)
            else:
                self.emit(REF, self.class_rule(item[1], item[2], alternatives))
        self.emit(END, 0)
        return start

    def emit_masks(self, masks: tuple[int, ...]) -> int:
        start = len(self.kinds)
        for mask in masks:
            self.emit(BYTES, mask)
        self.emit(END, 0)
        return start

    def class_alternatives(self, ranges, negated) -> list[tuple[int, ...]]:
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1] and not negated:
            code = ranges[0][0]   # a literal character: its exact bytes
            return [tuple(1 << byte for byte in chr(code).encode("utf-8"))]
        return class_to_masks(ranges, negated)

    def class_rule(self, ranges, negated, alternatives) -> int:
        key = (ranges, negated)
        rule_id = self.class_rules.get(key)
        if rule_id is None:
            rule_id = self.class_rules[key] = len(self.alts)
            self.alts.append(())
            self.names.append("<class>")
            self.pending.append((rule_id, alternatives))
        return rule_id


# ---- the automaton: interned states and cached transitions


class Automaton:
    """Runtime state cache of one grammar: state ids, transitions, masks of next bytes."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.uid = next(_serial_numbers)   # never reused, unlike id(): safe as a cache key
        self._lock = threading.Lock()
        self.generation = 0
        self._clear()
        starts = frozenset(self._expand_all([(start,) for start in program.alts[program.root]]))
        self.start_stacks = starts

    def _clear(self) -> None:
        self._index: dict[frozenset, int] = {}
        self.stacks: list[frozenset] = []
        self.next_bytes: list[int] = []   # per state: mask of bytes that lead somewhere
        self.can_end: list[bool] = []
        self.transitions: list[dict[int, int]] = []

    def compact_if_large(self) -> None:
        """Drop the caches once they grow too big (callers re-intern by generation)."""
        if len(self.stacks) > MAX_STATES:
            with self._lock:
                self._clear()
                self.generation += 1

    def intern(self, stacks: frozenset) -> int:
        state = self._index.get(stacks)
        if state is not None:
            return state
        args = self.program.args
        mask = 0
        for stack in stacks:
            if stack:
                mask |= args[stack[-1]]
        with self._lock:
            state = self._index.get(stacks)
            if state is None:
                state = len(self.stacks)
                self.stacks.append(stacks)
                self.next_bytes.append(mask)
                self.can_end.append(() in stacks)
                self.transitions.append({})
                self._index[stacks] = state
        return state

    def step(self, state: int, byte: int) -> int:
        """The state after `byte`, or DEAD."""
        row = self.transitions[state]
        following = row.get(byte)
        if following is None:
            following = self._compute_step(state, byte) if (self.next_bytes[state] >> byte) & 1 else DEAD
            row[byte] = following
        return following

    def _compute_step(self, state: int, byte: int) -> int:
        args = self.program.args
        advanced = []
        for stack in self.stacks[state]:
            if stack and (args[stack[-1]] >> byte) & 1:
                advanced.append(stack[:-1] + (stack[-1] + 1,))
        expanded = self._expand_all(advanced)
        return self.intern(frozenset(expanded)) if expanded else DEAD

    def _expand_all(self, stacks: list[tuple[int, ...]]) -> set[tuple[int, ...]]:
        """Rewrite stacks until each has a BYTES element on top (or is empty)."""
        kinds, args, alts = self.program.kinds, self.program.args, self.program.alts
        out: set[tuple[int, ...]] = set()
        seen: set[tuple[int, ...]] = set()
        todo = list(stacks)
        while todo:
            stack = todo.pop()
            if stack in seen:
                continue
            seen.add(stack)
            if not stack:
                out.add(stack)
                continue
            top = stack[-1]
            kind = kinds[top]
            if kind == BYTES:
                out.add(stack)
                if len(out) > MAX_STACKS:
                    raise GrammarError("the grammar is too ambiguous to match (too many parallel parses)")
            elif kind == END:
                todo.append(stack[:-1])
            else:
                # Push the return position unless the rule reference ends its alternative
                # (a tail call), so right-recursive repetition keeps the stack flat.
                base = stack[:-1] if kinds[top + 1] == END else stack[:-1] + (top + 1,)
                for start in alts[args[top]]:
                    todo.append(base + (start,))
        return out
