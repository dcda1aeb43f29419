"""GBNF building blocks for the JSON Schema converter: the primitive rules, literal and
character-class escaping, repetition suffixes, and integer ranges as digit patterns."""

from __future__ import annotations

import json

from pyengine.errors import GrammarError

UNBOUNDED_DIGITS = 16   # unbounded integers: at most this many digits, like llama.cpp

BUILTINS: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": ('" "?', ()),
    "boolean": ('"true" | "false"', ()),
    "null": ('"null"', ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "number": ('"-"? integral-part ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ("integral-part", "decimal-part")),
    "integer": ('"-"? integral-part', ("integral-part",)),
    "char": (r'[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": (r'"\"" char* "\""', ("char",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "member": ('string ":" space value', ("string", "space", "value")),
    "object": ('"{" (member ("," space member)*)? "}"', ("space", "member")),
    "array": ('"[" (value ("," space value)*)? "]"', ("space", "value")),
    "date": ('[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [1-2] [0-9] | "3" [0-1])', ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{3})? '
             '("Z" | ("+" | "-") ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "uuid": ('[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{12}', ()),
    "date-string": (r'"\"" date "\""', ("date",)),
    "time-string": (r'"\"" time "\""', ("time",)),
    "date-time-string": (r'"\"" date-time "\""', ("date-time",)),
    "uuid-string": (r'"\"" uuid "\""', ("uuid",)),
}
FORMATS = ("date", "time", "date-time", "uuid")

def gbnf_literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    out = []
    for char in text:
        code = ord(char)
        if char == "\"":
            out.append("\\\"")
        elif char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02X}")
        else:
            out.append(char)
    return "\"" + "".join(out) + "\""


def class_char(char: str) -> str:
    code = ord(char)
    if char.isascii() and char.isalnum():
        return char
    if code < 0x100:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def repeat(low: int, high: int | None) -> str:
    if (low, high) == (0, None):
        return "*"
    if (low, high) == (1, None):
        return "+"
    if (low, high) == (0, 1):
        return "?"
    if high is None:
        return f"{{{low},}}"
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"


def json_text(value: object, where: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise GrammarError(f"{where}: {value!r} is not a JSON value ({err})") from None


def json_type_matches(value: object, json_type: str) -> bool:
    if json_type == "null":
        return value is None
    if json_type == "boolean":
        return isinstance(value, bool)
    if json_type == "integer":
        return not isinstance(value, bool) and (isinstance(value, int) or
                                                (isinstance(value, float) and value.is_integer()))
    if json_type == "number":
        return not isinstance(value, bool) and isinstance(value, (int, float))
    if json_type == "string":
        return isinstance(value, str)
    if json_type == "array":
        return isinstance(value, list)
    return isinstance(value, dict)


# ---- integer ranges as digit patterns


def nat_range(low: int, high: int | None) -> str:
    """Decimal naturals in [low, high] (no leading zeros); high None = up to 16+ digits."""
    if high is None:
        high = 10 ** max(UNBOUNDED_DIGITS, len(str(low))) - 1
    alternatives = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        first = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        last = min(high, 10 ** digits - 1)
        if first <= last:
            alternatives.append(_same_length(str(first), str(last)))
    return " | ".join(alternatives)


def _same_length(low: str, high: str) -> str:
    common = 0
    while common < len(low) and low[common] == high[common]:
        common += 1
    prefix = gbnf_literal(low[:common]) + " " if common else ""
    low, high = low[common:], high[common:]
    if not low:
        return prefix.strip()
    rest = len(low) - 1
    if rest == 0:
        return f"{prefix}[{low}-{high}]"
    alternatives = []
    middle_from, middle_to = int(low[0]), int(high[0])
    if low[1:] != "0" * rest:
        alternatives.append(f"\"{low[0]}\" ({_same_length(low[1:], '9' * rest)})")
        middle_from += 1
    if high[1:] != "9" * rest:
        middle_to -= 1
    if middle_from <= middle_to:
        alternatives.append(f"[{middle_from}-{middle_to}] [0-9]{{{rest}}}")
    if high[1:] != "9" * rest:
        alternatives.append(f"\"{high[0]}\" ({_same_length('0' * rest, high[1:])})")
    return f"{prefix}({' | '.join(alternatives)})"


def int_range(low: int | None, high: int | None) -> str:
    """Decimal integers in [low, high] (either side may be unbounded)."""
    parts = []
    if low is None or low < 0:   # negative values: "-" and a magnitude
        magnitude_low = 1 if high is None or high >= 0 else -high
        magnitude_high = None if low is None else -low
        if magnitude_high is None or magnitude_low <= magnitude_high:
            parts.append(f"\"-\" ({nat_range(magnitude_low, magnitude_high)})")
    if high is None or high >= 0:
        start = 0 if low is None else max(low, 0)
        if high is None or start <= high:
            parts.append(f"({nat_range(start, high)})")
    return " | ".join(parts)


def decimals_within(low: int | None, high: int | None) -> list[str]:
    """Fractional numbers n.ddd lying entirely inside [low, high] (n and n+1 both in range)."""
    parts = []
    start = 0 if low is None else max(low, 0)
    stop = None if high is None else high - 1
    if stop is None or start <= stop:
        parts.append(f'({nat_range(start, stop)}) "." decimal-part')
    if low is None or low <= -1:
        start = 0 if high is None else max(0, -high)
        stop = None if low is None else -low - 1
        if stop is None or start <= stop:
            parts.append(f'"-" ({nat_range(start, stop)}) "." decimal-part')
    return parts
