"""A JSON Schema `pattern` (a regular expression) -> GBNF for the inside of a JSON string.

The regex constrains the decoded string; the grammar constrains the JSON text, so every
character is written the way JSON needs it: plain when it may appear raw, as an escape
(\\" \\\\ \\n \\u0001 ...) when it may not. Generated strings match the whole pattern (as if
it were anchored at both ends), which is a subset of what JSON Schema's unanchored search
accepts, so every output validates.

Supported: literals, escapes (\\d \\w \\s and their negations, \\t \\n \\r \\xHH \\uHHHH,
escaped metacharacters), classes with ranges and negation, '.', groups ( ), (?: ),
(?P<name> ), alternation, quantifiers * + ? {m} {m,} {m,n} {,n} (lazy ones too), and ^ / $
at the ends. Anything else (lookarounds, backreferences, \\b, flags, anchors in the
middle, possessive quantifiers) raises GrammarError: the converter fails closed.
"""

from __future__ import annotations

import re

from pyengine.errors import GrammarError
from pyengine.sample.gbnf import MAX_REPETITION

_MAX_CODE = 0x10FFFF
# Characters a JSON string may hold raw (DEL excluded, as in the `char` rule).
_RAW_SAFE = ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0x80, 0xD7FF), (0xE000, _MAX_CODE))
_JSON_ESCAPES = {"\"": "\\\"", "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_DIGITS = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = ((0x09, 0x0D), (0x20, 0x20))
_ASCII = ((0x00, 0x7F),)
_QUANTIFIER = re.compile(r"\{(\d*)(,?)(\d*)\}")
_MAX_NESTING = 100


def pattern_to_gbnf(pattern: str) -> str:
    """A GBNF expression for the JSON text (without quotes) of strings matching `pattern`."""
    if not isinstance(pattern, str):
        raise GrammarError(f"pattern must be a string, got {pattern!r}")
    return _RegexParser(pattern).parse()


class _RegexParser:
    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.pos = 0
        self.end = len(pattern)

    def fail(self, message: str) -> GrammarError:
        return GrammarError(f"pattern {self.text!r}: {message} (at offset {self.pos})")

    def parse(self) -> str:
        if self.text.startswith("^"):
            self.pos = 1
        elif self.text.startswith("\\A"):
            self.pos = 2
        if self.text.endswith("\\Z") and not _escaped(self.text, len(self.text) - 2):
            self.end -= 2
        elif self.text.endswith("$") and not _escaped(self.text, len(self.text) - 1):
            self.end -= 1
        expression = self.alternatives(0)
        if self.pos < self.end:
            raise self.fail("unbalanced ')'")
        return expression

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < self.end else ""

    def alternatives(self, depth: int) -> str:
        if depth > _MAX_NESTING:
            raise self.fail("groups nested too deeply")
        options = [self.sequence(depth)]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence(depth))
        if len(options) == 1:
            return options[0]
        return "(" + " | ".join(option or "\"\"" for option in options) + ")"

    def sequence(self, depth: int) -> str:
        items = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom(depth)
            items.append(self.quantified(atom))
        return " ".join(items)

    def atom(self, depth: int) -> str:
        char = self.peek()
        if char == "(":
            return self.group(depth)
        if char == "[":
            return _render_class(self.char_class())
        if char == ".":
            self.pos += 1
            return _render_class(_complement(((0x0A, 0x0A),)))
        if char == "\\":
            ranges = self.escape(in_class=False)
            return _render_class(ranges) if len(ranges) != 1 or ranges[0][0] != ranges[0][1] \
                else _render_char(chr(ranges[0][0]))
        if char in "*+?":
            raise self.fail(f"{char!r} has nothing to repeat")
        if char in "^$":
            raise self.fail(f"anchor {char!r} is only supported at the ends of the pattern")
        if char == "{" and _QUANTIFIER.match(self.text, self.pos):
            raise self.fail("a repetition has nothing to repeat")
        self.pos += 1
        return _render_char(char)

    def group(self, depth: int) -> str:
        self.pos += 1
        if self.text.startswith("?:", self.pos):
            self.pos += 2
        elif self.text.startswith("?P<", self.pos) or (self.text.startswith("?<", self.pos)
                                                     and self.text[self.pos + 2:self.pos + 3] not in "=!"):
            close = self.text.find(">", self.pos)
            if close < 0:
                raise self.fail("unterminated group name")
            self.pos = close + 1
        elif self.peek() == "?":
            raise self.fail("lookarounds, flags and other (?...) groups are not supported")
        inner = self.alternatives(depth + 1)
        if self.peek() != ")":
            raise self.fail("missing ')'")
        self.pos += 1
        return f"({inner})" if inner else "\"\""

    def quantified(self, atom: str) -> str:
        char = self.peek()
        if char in ("*", "+", "?"):
            self.pos += 1
            suffix = char
        else:
            match = _QUANTIFIER.match(self.text, self.pos) if char == "{" else None
            if match is None or match.end() > self.end or not (match.group(1) or match.group(3)):
                return atom
            low = int(match.group(1) or 0)
            high = low if not match.group(2) else (int(match.group(3)) if match.group(3) else None)
            if low > MAX_REPETITION or (high is not None and (high > MAX_REPETITION or high < low)):
                raise self.fail(f"repetition {match.group(0)} is out of range")
            self.pos = match.end()
            suffix = f"{{{low}}}" if high == low else f"{{{low},{'' if high is None else high}}}"
        if self.peek() == "?":
            self.pos += 1           # lazy: same language
        elif self.peek() == "+":
            raise self.fail("possessive quantifiers are not supported")
        elif self.peek() in ("*", "{") and (self.peek() == "*" or _QUANTIFIER.match(self.text, self.pos)):
            raise self.fail("multiple repeat")
        return f"({atom}){suffix}"

    def char_class(self) -> tuple[tuple[int, int], ...]:
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        shorthand = False
        first = True
        while self.peek() != "]" or first:
            if not self.peek():
                raise self.fail("unterminated character class")
            first = False
            if self.peek() == "\\":
                escaped = self.escape(in_class=True)
                if len(escaped) != 1 or escaped[0][0] != escaped[0][1]:
                    ranges.extend(escaped)
                    shorthand = True
                    continue
                low = escaped[0][0]
            else:
                low = ord(self.peek())
                self.pos += 1
            high = low
            if self.peek() == "-" and self.pos + 1 < self.end and self.text[self.pos + 1] != "]":
                self.pos += 1
                if self.peek() == "\\":
                    escaped = self.escape(in_class=True)
                    if len(escaped) != 1 or escaped[0][0] != escaped[0][1]:
                        raise self.fail("bad character range")
                    high = escaped[0][0]
                else:
                    high = ord(self.peek())
                    self.pos += 1
                if high < low:
                    raise self.fail("bad character range")
            ranges.append((low, high))
        self.pos += 1
        if not negated:
            return tuple(ranges)
        # \d, \w, \s are Unicode-aware in Python: their complement is only safe within ASCII
        return _complement(tuple(ranges), within=_ASCII if shorthand else None)

    def escape(self, in_class: bool) -> tuple[tuple[int, int], ...]:
        self.pos += 1
        char = self.peek()
        if not char:
            raise self.fail("pattern ends with a backslash")
        self.pos += 1
        shorthands = {"d": _DIGITS, "w": _WORD, "s": _SPACE}
        if char in shorthands:
            return shorthands[char]
        if char.lower() in shorthands:
            return _complement(shorthands[char.lower()], within=_ASCII)
        simple = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "0": "\0"}
        if char in simple:
            code = ord(simple[char])
            return ((code, code),)
        if char in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[char]
            digits = self.text[self.pos:self.pos + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"bad \\{char} escape")
            self.pos += width
            code = int(digits, 16)
            if code > _MAX_CODE:
                raise self.fail("code point out of range")
            return ((code, code),)
        if char == "b" and in_class:
            return ((8, 8),)
        if char.isalnum():
            raise self.fail(f"escape \\{char} is not supported")
        return ((ord(char), ord(char)),)


def _escaped(text: str, index: int) -> bool:
    count = 0
    while index - 1 - count >= 0 and text[index - 1 - count] == "\\":
        count += 1
    return count % 2 == 1


def _complement(ranges, within=None) -> tuple[tuple[int, int], ...]:
    low_bound, high_bound = (0, _MAX_CODE) if within is None else within[0]
    result, start = [], low_bound
    for low, high in sorted(ranges):
        if high < start:
            continue
        if low > start:
            result.append((start, min(low - 1, high_bound)))
        start = max(start, high + 1)
        if start > high_bound:
            break
    if start <= high_bound:
        result.append((start, high_bound))
    return tuple((a, b) for a, b in result if a <= b)


def _intersect(ranges, allowed) -> list[tuple[int, int]]:
    out = []
    for low, high in ranges:
        for a, b in allowed:
            if max(low, a) <= min(high, b):
                out.append((max(low, a), min(high, b)))
    return out


def _render_char(char: str) -> str:
    """One character as it must be written inside a JSON string, as a GBNF literal."""
    text = _JSON_ESCAPES.get(char)
    if text is None:
        code = ord(char)
        text = f"\\u{code:04x}" if code < 0x20 or code == 0x7F else char
    escaped = text.replace("\\", "\\\\").replace("\"", "\\\"")
    return f"\"{escaped}\""


def _render_class(ranges) -> str:
    """A set of characters: the raw-safe ones as a GBNF class, the rest as JSON escapes."""
    raw = _intersect(ranges, _RAW_SAFE)
    options = []
    if raw:
        options.append("[" + "".join(_class_range(a, b) for a, b in raw) + "]")
    for code in range(0x80):
        char = chr(code)
        if (code < 0x20 or char in "\"\\\x7f") and any(low <= code <= high for low, high in ranges):
            options.append(_render_char(char))
    if not options:
        raise GrammarError("pattern has a character class that matches nothing")
    return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"


def _class_range(low: int, high: int) -> str:
    return _class_code(low) if low == high else f"{_class_code(low)}-{_class_code(high)}"


def _class_code(code: int) -> str:
    if code < 0x80 and chr(code).isalnum():
        return chr(code)
    return f"\\x{code:02X}" if code < 0x100 else (f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}")
