"""GBNF (llama.cpp's grammar syntax) -> rules of code-point classes and rule references.

    name ::= alternative | alternative ...      # comments run to the end of the line
    items: "literal"  [a-z0-9_]  [^"\\\\]  .  rule-name  ( group )  and postfix * + ? {m} {m,} {m,n}
    escapes: \\xHH \\uHHHH \\UHHHHHHHH \\t \\r \\n \\\\ \\" \\[ \\] \\-

Repetitions and groups are rewritten into generated rules, as llama.cpp does:
S{m,n} -> S written m times, then n-m nested optional copies; S* -> R ::= S R | .
The parser fails closed: anything it does not understand raises GrammarError with the
position, undefined rules and left recursion are rejected, and sizes are bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import GrammarError

MAX_REPETITION = 10_000      # largest m or n in {m,n}
MAX_ITEMS = 400_000          # items in all rules together, after expanding repetitions
MAX_NESTING = 100            # depth of ( ... ) groups
MAX_CODE_POINT = 0x10FFFF

# An item is ("chars", ((lo, hi), ...), negated) or ("ref", rule_id).
Item = tuple
ANY_CHAR: Item = ("chars", ((0, MAX_CODE_POINT),), False)
_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", "\"": "\"", "[": "[", "]": "]", "-": "-"}
_HEX_WIDTH = {"x": 2, "u": 4, "U": 8}
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


@dataclass
class ParsedGrammar:
    names: list[str]                  # rule id -> name (generated rules: "<parent>_<n>")
    rules: list[list[list[Item]]]     # rule id -> alternatives -> items
    origin: list[str]                 # rule id -> the user-written rule it came from
    root: int


def parse_gbnf(text: str, root: str = "root") -> ParsedGrammar:
    if not isinstance(text, str):
        raise GrammarError(f"a GBNF grammar must be text, got {type(text).__name__}")
    parsed = _Parser(text).parse()
    return _validate(parsed, root)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.ids: dict[str, int] = {}
        self.names: list[str] = []
        self.rules: list[list[list[Item]] | None] = []
        self.origin: list[str] = []
        self.first_use: dict[int, str] = {}
        self.items = 0

    # ---- helpers

    def fail(self, message: str, at: int | None = None) -> GrammarError:
        at = self.pos if at is None else at
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        snippet = self.text[at:at + 20].split("\n")[0]
        return GrammarError(f"GBNF error at line {line}, column {column}: {message} (near {snippet!r})")

    def peek(self, offset: int = 0) -> str:
        at = self.pos + offset
        return self.text[at] if at < len(self.text) else ""

    def skip_space(self, newlines: bool) -> None:
        text, pos = self.text, self.pos
        while pos < len(text):
            c = text[pos]
            if c == "#":
                while pos < len(text) and text[pos] not in "\r\n":
                    pos += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                pos += 1
            else:
                break
        self.pos = pos

    def count_items(self, n: int) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise self.fail(f"grammar too large (more than {MAX_ITEMS} items after expanding repetitions)")

    def symbol(self, name: str, user_rule: str) -> int:
        rule_id = self.ids.get(name)
        if rule_id is None:
            rule_id = self.ids[name] = len(self.names)
            self.names.append(name)
            self.rules.append(None)
            self.origin.append(name)
            self.first_use[rule_id] = user_rule
        return rule_id

    def new_rule(self, parent: str) -> int:
        name = f"{parent}_{len(self.names)}"
        while name in self.ids:
            name += "_"
        rule_id = self.symbol(name, parent)
        self.origin[rule_id] = parent
        return rule_id

    # ---- grammar structure

    def parse(self) -> ParsedGrammar:
        self.skip_space(True)
        if self.pos >= len(self.text):
            raise GrammarError("the grammar is empty (it needs at least a 'root' rule)")
        while self.pos < len(self.text):
            self.parse_rule()
        return ParsedGrammar(self.names, self.rules, self.origin, -1)  # type: ignore[arg-type]

    def parse_name(self) -> str:
        start = self.pos
        while self.peek() in _NAME_CHARS and self.peek():
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting a rule name")
        return self.text[start:self.pos]

    def parse_rule(self) -> None:
        start = self.pos
        name = self.parse_name()
        self.skip_space(False)
        if not self.text.startswith("::=", self.pos):
            raise self.fail(f"expecting '::=' after rule name {name!r}")
        self.pos += 3
        self.skip_space(True)
        rule_id = self.symbol(name, name)
        if self.rules[rule_id] is not None:
            raise self.fail(f"rule {name!r} is defined twice", start)
        self.rules[rule_id] = [[]]  # mark as being defined (a self reference is fine)
        self.rules[rule_id] = self.parse_alternates(name, nested=False, depth=0)
        if self.peek() == "\r":
            self.pos += 2 if self.peek(1) == "\n" else 1
        elif self.peek() == "\n":
            self.pos += 1
        elif self.pos < len(self.text):
            raise self.fail("expecting a newline or the end of the grammar")
        self.skip_space(True)

    def parse_alternates(self, rule_name: str, nested: bool, depth: int) -> list[list[Item]]:
        alternatives = [self.parse_sequence(rule_name, nested, depth)]
        while self.peek() == "|":
            self.pos += 1
            self.skip_space(True)
            alternatives.append(self.parse_sequence(rule_name, nested, depth))
        return alternatives

    def parse_sequence(self, rule_name: str, nested: bool, depth: int) -> list[Item]:
        sequence: list[Item] = []
        last_start = -1   # where the most recent item (what a postfix operator repeats) begins
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "\"":
                last_start = len(sequence)
                self.parse_literal(sequence)
            elif c == "[":
                last_start = len(sequence)
                sequence.append(self.parse_class())
            elif c == ".":
                last_start = len(sequence)
                self.pos += 1
                sequence.append(ANY_CHAR)
            elif c in _NAME_CHARS:
                last_start = len(sequence)
                sequence.append(("ref", self.symbol(self.parse_name(), rule_name)))
            elif c == "(":
                last_start = len(sequence)
                sequence.append(self.parse_group(rule_name, depth))
            elif c in "*+?{":
                self.parse_repetition(sequence, last_start, rule_name)
            elif c in "<!":
                raise self.fail("token references (<...>) are not supported")
            else:
                break
            self.count_items(1)
            self.skip_space(nested)
        return sequence

    def parse_group(self, rule_name: str, depth: int) -> Item:
        if depth >= MAX_NESTING:
            raise self.fail(f"groups nested deeper than {MAX_NESTING}")
        open_at = self.pos
        self.pos += 1
        self.skip_space(True)
        rule_id = self.new_rule(rule_name)
        self.rules[rule_id] = self.parse_alternates(rule_name, nested=True, depth=depth + 1)
        if self.peek() != ")":
            raise self.fail("expecting ')' to close the '(' opened earlier" if self.peek() else
                            "unexpected end of grammar: unclosed '('", None if self.peek() else open_at)
        self.pos += 1
        return ("ref", rule_id)

    def parse_literal(self, sequence: list[Item]) -> None:
        open_at = self.pos
        self.pos += 1
        while True:
            if self.pos >= len(self.text):
                raise self.fail("unterminated string literal", open_at)
            if self.text[self.pos] == "\"":
                self.pos += 1
                return
            code = self.parse_char()
            sequence.append(("chars", ((code, code),), False))

    def parse_class(self) -> Item:
        open_at = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges = []
        while self.peek() != "]":
            if self.pos >= len(self.text):
                raise self.fail("unterminated character class", open_at)
            low = self.parse_char()
            high = low
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                high = self.parse_char()
                if high < low:
                    raise self.fail(f"empty character range {chr(low)!r}-{chr(high)!r}")
            ranges.append((low, high))
        self.pos += 1
        if not ranges:
            raise self.fail("empty character class", open_at)
        return ("chars", tuple(ranges), negated)

    def parse_char(self) -> int:
        c = self.peek()
        if c == "\\":
            kind = self.peek(1)
            if kind in _HEX_WIDTH:
                width = _HEX_WIDTH[kind]
                digits = self.text[self.pos + 2:self.pos + 2 + width]
                if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                    raise self.fail(f"expecting {width} hex digits after '\\{kind}'")
                self.pos += 2 + width
                return self.check_code(int(digits, 16))
            if kind in _ESCAPES:
                self.pos += 2
                return ord(_ESCAPES[kind])
            raise self.fail(f"unknown escape '\\{kind}'" if kind else "unexpected end of grammar after '\\'")
        if not c:
            raise self.fail("unexpected end of grammar")
        self.pos += 1
        return self.check_code(ord(c))

    def check_code(self, code: int) -> int:
        if code > MAX_CODE_POINT:
            raise self.fail(f"code point U+{code:X} is beyond U+10FFFF")
        if 0xD800 <= code <= 0xDFFF:
            raise self.fail(f"code point U+{code:04X} is a UTF-16 surrogate, not a character")
        return code

    def parse_repetition(self, sequence: list[Item], last_start: int, rule_name: str) -> None:
        c = self.text[self.pos]
        if last_start < 0 or last_start >= len(sequence):
            raise self.fail(f"{c!r} needs an item before it")
        self.pos += 1
        if c == "*":
            low, high = 0, None
        elif c == "+":
            low, high = 1, None
        elif c == "?":
            low, high = 0, 1
        else:
            low, high = self.parse_braces()
        self.expand_repetition(sequence, last_start, low, high, rule_name)

    def parse_braces(self) -> tuple[int, int | None]:
        self.skip_space(True)
        low = self.parse_count()
        self.skip_space(True)
        if self.peek() == "}":
            self.pos += 1
            return low, low
        if self.peek() != ",":
            raise self.fail("expecting ',' or '}' in a {m,n} repetition")
        self.pos += 1
        self.skip_space(True)
        high = self.parse_count() if self.peek().isdigit() else None
        self.skip_space(True)
        if self.peek() != "}":
            raise self.fail("expecting '}' to close a {m,n} repetition")
        self.pos += 1
        if high is not None and high < low:
            raise self.fail(f"repetition {{{low},{high}}} has its maximum below its minimum")
        return low, high

    def parse_count(self) -> int:
        start = self.pos
        while self.peek() and self.peek() in "0123456789":
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting a number in a {m,n} repetition")
        if self.pos - start > 6 or int(self.text[start:self.pos]) > MAX_REPETITION:
            raise self.fail(f"repetition count above {MAX_REPETITION}", start)
        return int(self.text[start:self.pos])

    def expand_repetition(self, sequence: list[Item], start: int, low: int, high: int | None,
                          rule_name: str) -> None:
        repeated = sequence[start:]
        del sequence[start:]
        optional = 1 if high is None else high - low
        self.count_items(len(repeated) * (low + optional) + 2 * optional)
        for _ in range(low):
            sequence.extend(repeated)
        if high is None:
            # R ::= S R | (empty): right recursion, so the matcher's stack stays flat
            loop = self.new_rule(rule_name)
            self.rules[loop] = [repeated + [("ref", loop)], []]
            sequence.append(("ref", loop))
            return
        tail = None
        for _ in range(optional):
            # each copy is optional and only reachable after the previous one
            rule_id = self.new_rule(rule_name)
            self.rules[rule_id] = [repeated + ([("ref", tail)] if tail is not None else []), []]
            tail = rule_id
        if tail is not None:
            sequence.append(("ref", tail))


# ---- checks after parsing


def _validate(parsed: ParsedGrammar, root: str) -> ParsedGrammar:
    for rule_id, alternatives in enumerate(parsed.rules):
        if alternatives is None:
            users = [parsed.origin[i] for i, alts in enumerate(parsed.rules)
                     if alts and any(("ref", rule_id) in alt for alt in alts)]
            where = f" (used in rule {users[0]!r})" if users else ""
            raise GrammarError(f"undefined rule {parsed.names[rule_id]!r}{where}")
    if root not in parsed.names:
        raise GrammarError(f"the grammar has no {root!r} rule")
    parsed.root = parsed.names.index(root)
    _reject_left_recursion(parsed)
    return parsed


def nullable_rules(rules: list[list[list[Item]]]) -> list[bool]:
    """Which rules can match the empty string.  A worklist: a rule is looked at again only
    when a rule it refers to became nullable (passes over every rule took one pass a link
    of a long chain of rules: quadratic in a hostile grammar's size)."""
    nullable = [False] * len(rules)
    users: list[list[int]] = [[] for _ in rules]   # rule id -> rules that refer to it
    todo = []
    for rule_id, alternatives in enumerate(rules):
        for alt in alternatives:
            if all(item[0] == "ref" for item in alt):
                for item in alt:
                    users[item[1]].append(rule_id)
                if not alt:
                    todo.append(rule_id)
    while todo:
        rule_id = todo.pop()
        if nullable[rule_id]:
            continue
        if any(all(nullable[item[1]] for item in alt) for alt in rules[rule_id]
               if all(item[0] == "ref" for item in alt)):
            nullable[rule_id] = True
            todo.extend(users[rule_id])
    return nullable


def _reject_left_recursion(parsed: ParsedGrammar) -> None:
    nullable = nullable_rules(parsed.rules)
    # leftmost[r]: rules that can start r's match without consuming anything first
    leftmost: list[set[int]] = []
    for alternatives in parsed.rules:
        starts: set[int] = set()
        for alt in alternatives:
            for item in alt:
                if item[0] != "ref":
                    break
                starts.add(item[1])
                if not nullable[item[1]]:
                    break
        leftmost.append(starts)
    cycle_rule = _find_cycle(leftmost)
    if cycle_rule is not None:
        name = parsed.origin[cycle_rule]
        via = parsed.names[cycle_rule]
        detail = f" (via generated rule {via!r})" if via != name else ""
        raise GrammarError(f"rule {name!r} is left-recursive{detail}: it can reach itself "
                           "without consuming input")


def _find_cycle(edges: list[set[int]]) -> int | None:
    """A node on some cycle of the graph, or None (iterative three-colour DFS)."""
    colour = [0] * len(edges)  # 0 new, 1 on the stack, 2 done
    for start in range(len(edges)):
        if colour[start]:
            continue
        stack = [(start, iter(edges[start]))]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            for child in children:
                if colour[child] == 1:
                    return child
                if colour[child] == 0:
                    colour[child] = 1
                    stack.append((child, iter(edges[child])))
                    break
            else:
                colour[node] = 2
                stack.pop()
    return None
