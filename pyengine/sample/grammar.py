"""Public grammar objects: Grammar (compiled, shareable) and GrammarMatcher (per sequence).

    grammar = Grammar.from_gbnf('root ::= "yes" | "no"')
    matcher = grammar.matcher()
    matcher.accepts(b"ye")       # True: a prefix of an accepted string
    matcher.accept_bytes(b"yes") # advances; matcher.can_end() is now True
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Mapping

from pyengine.errors import GrammarError
from pyengine.sample.automaton import DEAD, Automaton, Program, compile_program
from pyengine.sample.gbnf import parse_gbnf

_PROGRAM_CACHE_SIZE = 32
_program_cache: OrderedDict[tuple[str, str], Program] = OrderedDict()
_program_lock = threading.Lock()


def _compiled(text: str, root: str) -> Program:
    key = (text, root)
    with _program_lock:
        program = _program_cache.get(key)
        if program is not None:
            _program_cache.move_to_end(key)
            return program
    program = compile_program(parse_gbnf(text, root))
    with _program_lock:
        _program_cache[key] = program
        while len(_program_cache) > _PROGRAM_CACHE_SIZE:
            _program_cache.popitem(last=False)
    return program


class Grammar:
    """A compiled grammar. Compilation is cached by text; each Grammar owns its state cache."""

    def __init__(self, program: Program, source: str) -> None:
        self._program = program
        self.source = source
        self.automaton = Automaton(program)

    @classmethod
    def from_gbnf(cls, text: str, root: str = "root") -> "Grammar":
        """Compile GBNF text; GrammarError on any syntax error, undefined rule or left recursion."""
        if not isinstance(root, str) or not root:
            raise GrammarError(f"root must be a rule name, got {root!r}")
        return cls(_compiled(text, root), text)

    @classmethod
    def from_json_schema(cls, schema: Mapping[str, object] | bool) -> "Grammar":
        """A grammar producing JSON documents valid for the schema (a supported subset)."""
        from pyengine.sample.json_schema import schema_to_grammar
        return cls.from_gbnf(schema_to_grammar(schema))

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (Ollama's format="json")."""
        from pyengine.sample.json_schema import JSON_OBJECT_GRAMMAR
        return cls.from_gbnf(JSON_OBJECT_GRAMMAR)

    @classmethod
    def from_format(cls, value: object) -> "Grammar":
        """Ollama's `format`: "json" (any JSON object), or a JSON schema (a mapping or its JSON text)."""
        if value == "json":
            return cls.json_object()
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise GrammarError(f'format must be "json" or a JSON schema, got {value[:60]!r}') from None
        if not isinstance(value, (Mapping, bool)):
            raise GrammarError(f'format must be "json" or a JSON schema, got {type(value).__name__}')
        return cls.from_json_schema(value)

    def matcher(self) -> "GrammarMatcher":
        """A fresh matcher at the start of the grammar."""
        return GrammarMatcher(self)

    def matches(self, text: str | bytes) -> bool:
        """Whether the whole text is a complete sentence of the grammar."""
        matcher = self.matcher()
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return matcher.accept_bytes(data) and matcher.can_end()

    def __deepcopy__(self, memo: dict) -> "Grammar":
        return self  # compiled and shared; per-sequence state lives in GrammarMatcher

    def __repr__(self) -> str:
        return f"Grammar({len(self._program.alts)} rules, {len(self._program.kinds)} elements)"


class GrammarMatcher:
    """Where one sequence stands in a grammar. Cheap to copy (fork) and to advance."""

    __slots__ = ("grammar", "_stacks", "_state", "_generation")

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        automaton = grammar.automaton
        self._stacks = automaton.start_stacks
        self._state = automaton.intern(self._stacks)
        self._generation = automaton.generation

    def state_id(self) -> int:
        """The interned id of the current state (valid for the automaton's current generation)."""
        automaton = self.grammar.automaton
        if self._generation != automaton.generation:
            self._state = automaton.intern(self._stacks)
            self._generation = automaton.generation
        return self._state

    def copy(self) -> "GrammarMatcher":
        twin = GrammarMatcher.__new__(GrammarMatcher)
        twin.grammar = self.grammar
        twin._stacks = self._stacks
        twin._state = self._state
        twin._generation = self._generation
        return twin

    __copy__ = copy

    def __deepcopy__(self, memo: dict) -> "GrammarMatcher":
        return self.copy()

    def _walk(self, data: bytes) -> int:
        automaton = self.grammar.automaton
        state = self.state_id()
        step = automaton.step
        for byte in data:
            state = step(state, byte)
            if state == DEAD:
                return DEAD
        return state

    def accepts(self, data: bytes) -> bool:
        """Whether `data` can come next (without advancing)."""
        return self._walk(data) != DEAD

    def accept_bytes(self, data: bytes) -> bool:
        """Advance over `data` if the grammar allows it; returns False (and stays put) if not."""
        self.grammar.automaton.compact_if_large()
        state = self._walk(data)
        if state == DEAD:
            return False
        self._state = state
        self._stacks = self.grammar.automaton.stacks[state]
        return True

    def accept_text(self, text: str) -> bool:
        return self.accept_bytes(text.encode("utf-8"))

    def can_end(self) -> bool:
        """Whether the input so far is a complete sentence (so end-of-generation is allowed)."""
        return self.grammar.automaton.can_end[self.state_id()]

    def next_bytes(self) -> list[int]:
        """The bytes that may come next."""
        mask = self.grammar.automaton.next_bytes[self.state_id()]
        return [byte for byte in range(256) if (mask >> byte) & 1]

    def forced_bytes(self, limit: int = 64) -> bytes:
        """The bytes every continuation starts with (at most `limit`): the grammar allows
        exactly one next byte, and no end, at each of them. Empty where there is a choice."""
        automaton = self.grammar.automaton
        state, out = self.state_id(), bytearray()
        while len(out) < limit and not automaton.can_end[state]:
            mask = automaton.next_bytes[state]
            if not mask or mask & (mask - 1):
                break
            byte = mask.bit_length() - 1
            out.append(byte)
            state = automaton.step(state, byte)
        return bytes(out)

    def is_finished(self) -> bool:
        """Complete, and nothing more may follow."""
        state = self.state_id()
        automaton = self.grammar.automaton
        return automaton.can_end[state] and automaton.next_bytes[state] == 0

    def depth(self) -> int:
        """Shortest pending stack (how deeply nested the cheapest way out is)."""
        return min((len(stack) for stack in self._stacks), default=0)
