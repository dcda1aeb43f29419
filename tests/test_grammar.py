"""GBNF grammars: parsing, matching bytes and code points, errors, token masks."""

import random
import time

import numpy as np
import pytest

from pyengine.errors import GrammarError
from pyengine.sample import Grammar
from pyengine.sample.automaton import utf8_sequences
from pyengine.sample.token_mask import TokenIndex

ARITHMETIC = r"""
# a small arithmetic language
root   ::= expr
expr   ::= term (ws [-+] ws term)*
term   ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
ws     ::= [ ]?
"""


@pytest.fixture(scope="module")
def arithmetic():
    return Grammar.from_gbnf(ARITHMETIC)


@pytest.mark.parametrize("text", ["1", "1+2*3", "(1.5 - 2) / -3", "((7))", "-(-4.25*10)", "12 * (3+4) - 5"])
def test_arithmetic_accepts(arithmetic, text):
    assert arithmetic.matches(text)


@pytest.mark.parametrize("text", ["", "1+", "(1", "1++2", "a", "1.", "1 +  2", ")", "1 2", "--"])
def test_arithmetic_rejects(arithmetic, text):
    assert not arithmetic.matches(text)


def test_prefixes_are_accepted_but_cannot_end(arithmetic):
    matcher = arithmetic.matcher()
    assert matcher.accepts(b"(1+")
    assert matcher.accept_bytes(b"(1+")
    assert not matcher.can_end()
    assert not matcher.accept_bytes(b"x")        # rejected input leaves the state unchanged
    assert matcher.accept_bytes(b"2)") and matcher.can_end()
    assert set(matcher.next_bytes()) == set(b" +-*/")


def test_matcher_copies_are_independent(arithmetic):
    matcher = arithmetic.matcher()
    matcher.accept_text("1")
    fork = matcher.copy()
    assert fork.accept_text("+2")
    assert matcher.can_end() and not matcher.accepts(b")")
    assert fork.can_end()
    assert matcher.accept_text("*3") and fork.accept_text("*4")


def test_repetition_counts():
    grammar = Grammar.from_gbnf('root ::= "a"{2} "b"{1,3} "c"{2,} "d"? "e"*')
    for text, ok in [("aabcc", True), ("aabbbccccde", True), ("abcc", False), ("aabbbbcc", False),
                     ("aabc", False), ("aabccdd", False), ("aabcceee", True)]:
        assert grammar.matches(text) == ok, text


def test_groups_alternatives_and_multiline_rules():
    grammar = Grammar.from_gbnf('root ::= (\n  "x" |\n  "y" "z"\n)+ end\nend ::= "!" | ')
    assert grammar.matches("xyzx!") and grammar.matches("yz") and not grammar.matches("xy")


def test_escapes_and_unicode_literals():
    grammar = Grammar.from_gbnf(r'root ::= "\x41\u00e9\U0001F600" [\n\t] "\"\\" [\]\-\[]')
    assert grammar.matches("Aé😀\n\"\\]")
    assert grammar.matches("Aé😀\t\"\\-")
    assert not grammar.matches("Ae😀\n\"\\]")


def test_classes_ranges_negation_and_any():
    grammar = Grammar.from_gbnf('root ::= [a-cx] [^a-z] . [α-ω]')
    assert grammar.matches("b7😀β")
    assert grammar.matches("xZ\nω")
    assert not grammar.matches("dZ\nω")
    assert not grammar.matches("bq\nω")
    assert not grammar.matches("b7😀a")


def test_partial_utf8_prefixes():
    grammar = Grammar.from_gbnf('root ::= [α-ω]+')
    matcher = grammar.matcher()
    beta = "β".encode()
    assert matcher.accepts(beta[:1])              # a lead byte that can still become β
    assert not matcher.accepts(b"\xff")
    assert not matcher.accepts("é".encode()[:1])   # \xc3 can only start characters outside α-ω
    assert matcher.accept_bytes(beta[:1]) and not matcher.can_end()
    assert matcher.accept_bytes(beta[1:]) and matcher.can_end()
    negated = Grammar.from_gbnf('root ::= [^a]')
    for char in ["b", "é", "€", "😀", "\x00"]:
        assert negated.matches(char)
    assert not negated.matches("a") and not negated.matches(b"\xed\xa0\x80")   # a UTF-8 surrogate


def test_utf8_sequences_cover_exactly_the_range():
    rng = random.Random(0)
    for _ in range(40):
        low = rng.randrange(0, 0x10FFFF)
        high = min(0x10FFFF, low + rng.choice([1, 50, 3000, 70000]))
        if low <= 0xDFFF and high >= 0xD800:
            continue
        sequences = utf8_sequences(low, high)
        for code in {low, high, (low + high) // 2, rng.randint(low, high)}:
            data = chr(code).encode()
            assert any(len(s) == len(data) and all(a <= b <= c for (a, c), b in zip(s, data)) for s in sequences)
        for code in (low - 1, high + 1):
            if 0 <= code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
                data = chr(code).encode()
                assert not any(len(s) == len(data) and all(a <= b <= c for (a, c), b in zip(s, data))
                               for s in sequences)


def test_right_recursion_keeps_the_stack_flat():
    grammar = Grammar.from_gbnf('root ::= "a" root | "b"')
    matcher = grammar.matcher()
    assert matcher.accept_bytes(b"a" * 5000 + b"b") and matcher.can_end()
    assert len(grammar.automaton.stacks) < 10


def test_nested_recursion_and_finished_state():
    grammar = Grammar.from_gbnf('root ::= "(" root ")" | "x"')
    matcher = grammar.matcher()
    assert matcher.accept_bytes(b"((x))")
    assert matcher.is_finished()
    assert not Grammar.from_gbnf('root ::= "x" "y"?').matcher().is_finished()


def test_custom_root_name():
    grammar = Grammar.from_gbnf('start ::= "ok"', root="start")
    assert grammar.matches("ok")
    with pytest.raises(GrammarError, match="root"):
        Grammar.from_gbnf('start ::= "ok"')


@pytest.mark.parametrize("text, fragment", [
    ('root ::= root "a" | "b"', "left-recursive"),
    ('root ::= a "x"\na ::= "y"? root', "left-recursive"),
    ('root ::= b\nb ::= c*\nc ::= "x"?', "left-recursive"),
    ('root ::= undefined-thing', "undefined rule 'undefined-thing'"),
    ('main ::= "x"', "no 'root' rule"),
    ('root ::= "x"\nroot ::= "y"', "defined twice"),
    ('root ::= "abc', "unterminated string"),
    ('root ::= [abc', "unterminated character class"),
    ('root ::= ("a" | "b"', "unclosed"),
    ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\x4"', "hex digits"),
    ('root ::= "a"{3,2}', "maximum below its minimum"),
    ('root ::= "a"{99999}', "above"),
    ('root ::= *"a"', "needs an item"),
    ('root ::= []', "empty character class"),
    ('root ::= [z-a]', "empty character range"),
    ('root "x"', "::="),
    ('root ::= "a" }', "newline"),
    ('root ::= <[12]>', "token references"),
    ('root ::= "\\uD800"', "surrogate"),
    ('', "empty"),
])
def test_malformed_grammars_raise_clear_errors(text, fragment):
    with pytest.raises(GrammarError, match=fragment):
        Grammar.from_gbnf(text)


def malformed_grammars(count, seed=0):
    """A varied generated list of grammars that are all invalid."""
    rng = random.Random(seed)
    def name():
        return rng.choice("abcdefgh") + "".join(rng.choice("xyz0-") for _ in range(rng.randint(0, 6)))
    families = [
        lambda n: f'root ::= "{n}',                                   # unterminated literal
        lambda n: f'root ::= [{n}',                                   # unterminated class
        lambda n: f'root ::= ({n} | "x"',                             # unclosed group
        lambda n: f'root ::= {n}',                                    # undefined rule
        lambda n: f'root ::= "x"\n{n} ::= {n} "y"',                   # left recursion
        lambda n: f'root ::= {n}\n{n} ::= "q"? root',                  # indirect left recursion
        lambda n: f'{n} ::= "x"' if n != "root" else 'x ::= "y"',     # no root
        lambda n: f'root ::= "\\{rng.choice("qQzZ")}{n}"',              # unknown escape
        lambda n: f'root ::= "a"{{{rng.randint(5, 9)},{rng.randint(0, 4)}}}',  # max < min
        lambda n: f'root ::= "a"{{{rng.randint(10**5, 10**9)}}}',     # absurd repetition
        lambda n: f'root ::= {rng.choice("*+?")} "{n}"',              # postfix without item
        lambda n: f'root ::= "a" {rng.choice(")]}@$%&")} "{n}"',      # stray character
        lambda n: f'root := "{n}"',                                   # wrong operator
        lambda n: f'root ::= "x"\nroot ::= "{n}"',                    # duplicate rule
        lambda n: f'root ::= [{n[0]}-{chr(max(ord(n[0]) - 1, 32))}]' if ord(n[0]) > 33 else "root ::= []",
        lambda n: "root ::= " + "(" * rng.randint(101, 300) + '"x"' + ")" * 300,   # nesting too deep
        lambda n: f'root ::= "\\x{rng.choice("GZ")}{rng.randint(0, 9)}"',            # bad hex
        lambda n: f'root ::= <{n}>',                                  # token reference
    ]
    return [families[i % len(families)](name()) for i in range(count)]


def test_two_hundred_malformed_grammars_are_rejected_quickly():
    grammars = malformed_grammars(200)
    assert len(set(grammars)) > 150
    start = time.perf_counter()
    for text in grammars:
        t0 = time.perf_counter()
        with pytest.raises(GrammarError):
            Grammar.from_gbnf(text)
        assert time.perf_counter() - t0 < 0.1, text
    assert time.perf_counter() - start < 1.0


def test_random_mutations_never_crash():
    rng = random.Random(1)
    for _ in range(300):
        chars = list(ARITHMETIC)
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(chars))
            action = rng.random()
            if action < 0.4:
                del chars[position]
            elif action < 0.8:
                chars.insert(position, rng.choice('"[]()|*+?{}:=\\-^.#\n ax0'))
            else:
                chars[position] = rng.choice('"[]()|')
        try:
            Grammar.from_gbnf("".join(chars))
        except GrammarError:
            pass


# ---- token masks


def random_vocab(size, seed):
    rng = random.Random(seed)
    pieces = [bytes([b]) for b in range(256)]
    alphabet = ["a", "b", "1", "2", "+", "(", ")", " ", ".", "é", "β", "-", "*"]
    while len(pieces) < size:
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))).encode()
        cut = rng.random()
        if cut < 0.1:
            word = word[:-1] or word                     # may end inside a character
        elif cut < 0.15:
            word = "β".encode()[1:] + word               # may start inside a character
        pieces.append(word)
    pieces.append(b"")
    return pieces


def test_token_mask_matches_brute_force(arithmetic):
    pieces = random_vocab(3000, 0)
    index = TokenIndex.for_pieces(pieces, [5])
    matcher = arithmetic.matcher()
    for prefix in [b"", b"(", b"1", b"12 +", b"(3.", b"-(", b"7)"[:1]]:
        state = matcher.copy()
        assert state.accept_bytes(prefix)
        mask = index.allowed_mask(state)
        brute = np.array([bool(p) and i != 5 and state.accepts(p) for i, p in enumerate(pieces)])
        assert np.array_equal(mask, brute), prefix
        assert np.array_equal(index.allowed_mask(state), brute)    # cached
        pre = index.prefix_ok(state)
        assert not (brute & ~pre).any()                            # the pre-filter never drops a good token


def test_token_mask_with_partial_utf8_pieces():
    grammar = Grammar.from_gbnf('root ::= [α-ω]+ "."')
    beta = "β".encode()
    pieces = [beta[:1], beta[1:], beta, b".", "é".encode()[:1], beta + beta[:1], b"a"]
    index = TokenIndex(pieces)
    matcher = grammar.matcher()
    assert index.allowed_mask(matcher).tolist() == [True, False, True, False, False, True, False]
    matcher.accept_bytes(beta[:1])
    assert index.allowed_mask(matcher).tolist() == [False, True, False, False, False, False, False]


def test_a_too_ambiguous_grammar_is_refused_early():
    """Nested repetitions of a recursive rule add ~500 parallel parses per "yes"; the
    matcher refuses with a GrammarError before a byte costs more than a few ms."""
    grammar = Grammar.from_gbnf('root ::= "yes"+++++++++ root+++')
    matcher = grammar.matcher()
    with pytest.raises(GrammarError, match="too ambiguous"):
        for _ in range(12):
            matcher.accept_bytes(b"yes")


def test_a_long_chain_of_rules_compiles_in_linear_time():
    """Which rules match the empty string is found in one sweep: 3,000 rules, each only
    referring to the next, took 15 s when every pass over the rules settled one link."""
    n = 3000
    text = ('root ::= a0 "z"\n' + "".join(f"a{i} ::= a{i + 1}\n" for i in range(n))
            + f'a{n} ::= "" | "q"\n')
    start = time.monotonic()
    grammar = Grammar.from_gbnf(text)
    assert time.monotonic() - start < 2.0
    assert grammar.matches("z") and grammar.matches("qz") and not grammar.matches("qqz")


def test_nullable_rules():
    from pyengine.sample.gbnf import nullable_rules

    x = ("chars", ((120, 120),), False)
    rules = [[[("ref", 1), ("ref", 2)]],   # 0: both nullable
             [[x], []],                    # 1: an empty alternative
             [[("ref", 1)]],               # 2: through 1
             [[("ref", 1), x]],            # 3: a character after it
             [[("ref", 4)], [("ref", 3)]]]  # 4: only through itself or 3
    assert nullable_rules(rules) == [True, True, True, False, False]
