"""JSON Schema -> grammar: generated strings parse and validate; constrained sampling too."""

import collections
import json
import random
import time

import jsonschema
import numpy as np
import pytest

from pyengine.errors import GrammarError
from pyengine.sample import Grammar, SamplerChain, SamplingOptions, schema_to_grammar
from pyengine.sample.json_schema import int_range

SCHEMAS = [
    # 1 flat object, all required
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"]},
    # 2 nested objects, optional properties in given order
    {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1},
        "owner": {"type": "object", "properties": {"first": {"type": "string", "maxLength": 8},
                                                   "last": {"type": "string", "maxLength": 8}},
                  "required": ["last"]},
        "active": {"type": "boolean"}},
     "required": ["id"]},
    # 3 array of bounded numbers with item limits
    {"type": "array", "items": {"type": "number", "minimum": -5, "maximum": 10}, "minItems": 1, "maxItems": 4},
    # 4 string enum with unicode
    {"enum": ["red", "grün", "青", "with \"quote\""]},
    # 5 const object
    {"type": "object", "properties": {"version": {"const": {"major": 1, "tags": ["a", None]}}},
     "required": ["version"]},
    # 6 string lengths
    {"type": "string", "minLength": 2, "maxLength": 5},
    # 7 negative integer range
    {"type": "integer", "minimum": -1234, "maximum": -7},
    # 8 number with exclusive bounds
    {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 100},
    # 9 type list
    {"type": "object", "properties": {"note": {"type": ["string", "null"]}, "n": {"type": ["integer", "boolean"]}},
     "required": ["note", "n"]},
    # 10 $ref to $defs
    {"$defs": {"address": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 12},
                                                            "zip": {"type": "integer", "minimum": 10000,
                                                                    "maximum": 99999}},
                           "required": ["street", "zip"]}},
     "type": "object", "properties": {"home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"}},
     "required": ["home"]},
    # 11 recursive tree
    {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer", "minimum": 0, "maximum": 9},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["value"]}},
     "$ref": "#/$defs/node"},
    # 12 anyOf
    {"type": "array", "items": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "integer"}]}, "maxItems": 5},
    # 13 oneOf told apart by const
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}},
                "required": ["kind", "r"]},
               {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
                "required": ["kind", "side"]}]},
    # 14 additionalProperties as a schema
    {"type": "object", "properties": {"total": {"type": "integer"}}, "required": ["total"],
     "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 50}},
    # 15 additionalProperties true: declared names keep their schema
    {"type": "object", "properties": {"a": {"type": "boolean"}, "ab": {"type": "null"}},
     "additionalProperties": True},
    # 16 tuple via prefixItems
    {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "integer"}, {"type": "boolean"}],
     "items": False},
    # 17 formats
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                      "at": {"type": "string", "format": "date-time"},
                                      "id": {"type": "string", "format": "uuid"}},
     "required": ["day", "at", "id"]},
    # 18 allOf merged
    {"allOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
               {"properties": {"y": {"type": "string", "enum": ["p", "q"]}}, "required": ["y"]}]},
    # 19 any JSON value
    {},
    # 20 draft-7 definitions, required key without a property schema, draft-4 exclusive flags
    {"$schema": "http://json-schema.org/draft-04/schema#",
     "definitions": {"pct": {"type": "integer", "minimum": 0, "maximum": 100, "exclusiveMaximum": True}},
     "type": "object", "properties": {"p": {"$ref": "#/definitions/pct"}}, "required": ["p", "extra"]},
]


def validator_for(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def shortest_ending(matcher, limit=5000):
    """Bytes leading from the matcher's state to a complete sentence (breadth-first), or None."""
    automaton = matcher.grammar.automaton
    start = matcher.state_id()
    parents = {start: None}
    queue = collections.deque([start])
    while queue and len(parents) < limit:
        state = queue.popleft()
        if automaton.can_end[state]:
            path = []
            while parents[state] is not None:
                state, byte = parents[state]
                path.append(byte)
            return bytes(reversed(path))
        mask = automaton.next_bytes[state]
        for byte in range(256):
            if (mask >> byte) & 1:
                following = automaton.step(state, byte)
                if following not in parents:
                    parents[following] = (state, byte)
                    queue.append(following)
    return None


def walk(grammar, rng, soft=250, hard=20_000):
    """A random byte string of the grammar: random acceptable bytes, then a way out."""
    matcher = grammar.matcher()
    out = bytearray()
    while True:
        options = matcher.next_bytes()
        if matcher.can_end() and (not options or rng.random() < 0.15 or len(out) > soft):
            return bytes(out)
        if len(out) > soft:
            ending = shortest_ending(matcher)
            if ending is not None:
                assert matcher.accept_bytes(ending) and matcher.can_end()
                return bytes(out + ending)
            def depth_after(byte):
                trial = matcher.copy()
                trial.accept_bytes(bytes([byte]))
                return trial.depth(), rng.random()
            byte = min(options, key=depth_after)
        else:
            byte = rng.choice(options)
        assert matcher.accept_bytes(bytes([byte]))
        out.append(byte)
        assert len(out) < hard, "the walk does not terminate"


@pytest.mark.parametrize("number", range(1, len(SCHEMAS) + 1))
def test_random_strings_of_each_schema_validate(number):
    schema = SCHEMAS[number - 1]
    grammar = Grammar.from_json_schema(schema)
    validator = validator_for(schema)
    rng = random.Random(number)
    for _ in range(25):
        text = walk(grammar, rng)
        value = json.loads(text.decode("utf-8"))
        errors = list(validator.iter_errors(value))
        assert not errors, (text, errors[0].message)


def test_there_are_twenty_schemas():
    assert len(SCHEMAS) == 20


# ---- specific behaviours


def test_property_order_is_kept_and_optional_ones_may_be_skipped():
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"},
                                               "c": {"type": "integer"}}, "required": ["c"]}
    grammar = Grammar.from_json_schema(schema)
    assert grammar.matches('{"b":1,"a":2,"c":3}')
    assert grammar.matches('{"c":3}') and grammar.matches('{"a": 2, "c": 3}')
    assert not grammar.matches('{"a":2,"b":1,"c":3}')     # out of order
    assert not grammar.matches('{"b":1}')                  # c is required
    assert not grammar.matches('{"c":3,}') and not grammar.matches('{,"c":3}')
    assert not grammar.matches('{"c":3,"d":4}')            # no additional properties


def test_additional_keys_exclude_declared_names():
    grammar = Grammar.from_json_schema({"type": "object", "properties": {"ab": {"type": "integer"}},
                                        "additionalProperties": {"type": "string"}})
    assert grammar.matches('{"ab":1,"a":"x","abc":"y","b":"z"}')
    assert not grammar.matches('{"ab":1,"ab":"x"}')        # would redefine ab with the wrong type
    assert not grammar.matches('{"ab":1,"a\\u0062":"x"}')   # not even spelled with an escape


@pytest.mark.parametrize("low, high", [(-15, 123), (0, 9), (7, 7), (-1000, -990), (95, 1005), (-3, 0)])
def test_integer_ranges_are_exact(low, high):
    grammar = Grammar.from_gbnf(f"root ::= {int_range(low, high)}")
    for value in range(low - 30, high + 31):
        assert grammar.matches(str(value)) == (low <= value <= high), value
    assert not grammar.matches(f"0{abs(high)}") and not grammar.matches("-0")


def test_half_open_integer_ranges():
    at_least = Grammar.from_gbnf(f"root ::= {int_range(250, None)}")
    assert at_least.matches("250") and at_least.matches("99999999") and not at_least.matches("249")
    at_most = Grammar.from_gbnf(f"root ::= {int_range(None, -4)}")
    assert at_most.matches("-4") and at_most.matches("-123456") and not at_most.matches("-3")


PATTERNS = [r"^[A-Z]{3}-\d{4}$", r"^(foo|bar)+$", r"\w+@\w+\.com", r'^a"b\\c\n?$', r"^[^a-z]?x{2,}y*?$",
            r"^(?:\+?1[- ]?)?\(?\d{3}\)?[- ]?\d{3}-\d{4}$", r"^[\u00e0-\u00ff\s]{1,5}\.$", r"^(?P<k>[a-c])\D\W\S$",
            r"^$", r"^.{0,3}$"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_strings_match_the_regex(pattern):
    schema = {"type": "string", "pattern": pattern}
    grammar = Grammar.from_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(pattern)
    for _ in range(30):
        text = walk(grammar, rng, soft=60)
        value = json.loads(text.decode("utf-8"))
        assert not list(validator.iter_errors(value)), (pattern, text)


def test_pattern_grammar_accepts_and_rejects():
    grammar = Grammar.from_json_schema({"type": "string", "pattern": r"^[A-Z]{2}\d+$"})
    assert grammar.matches('"AB12"') and not grammar.matches('"Ab12"') and not grammar.matches('"AB"')


def test_a_pattern_without_a_type_is_kept():
    """Found by fuzz/: {"pattern": ...} without "type" allowed any value, strings that
    do not match the pattern included."""
    grammar = Grammar.from_json_schema({"pattern": "^[a-c]{2}x?$"})
    assert grammar.matches('"abx"') and grammar.matches('"cc"')
    assert not grammar.matches('"[Fwy"') and not grammar.matches('"abxx"')


@pytest.mark.parametrize("pattern", [r"(?=a)b", r"(a)\1", r"\bword", r"a{3,1}", r"(ab", r"ab)", r"a**", r"(?i)abc",
                                     r"a++", r"x^y", r"[z-a]", "abc\\"])
def test_unsupported_or_invalid_patterns_fail_closed(pattern):
    with pytest.raises(GrammarError, match="pattern"):
        Grammar.from_json_schema({"type": "string", "pattern": pattern})


def test_json_object_grammar():
    grammar = Grammar.json_object()
    assert grammar.matches('{"a": [1, -2.5e3, true, null, {"b": "\\u00e9\\n"}]}')
    assert grammar.matches("{}") and grammar.matches('{"k":"v"}')
    assert not grammar.matches('{\n  "k": "v"\n}')   # compact: no newlines, no indents
    assert not grammar.matches("[1]") and not grammar.matches('{"a" 1}') and not grammar.matches('{"a": 01}')


def test_from_format_accepts_json_and_schemas():
    assert Grammar.from_format("json").matches('{"a": 1}')
    assert Grammar.from_format({"type": "integer"}).matches("42")
    assert Grammar.from_format('{"type": "boolean"}').matches("true")
    with pytest.raises(GrammarError, match="format"):
        Grammar.from_format("yaml")


def test_output_is_gbnf_text_with_a_root_rule():
    text = schema_to_grammar({"type": "string"})
    assert text.splitlines()[0].startswith(("string ::=", "root ::=", "char ::="))
    assert "root ::=" in text


@pytest.mark.parametrize("schema, fragment", [
    ({"type": "strnig"}, "unknown JSON type"),
    ({"type": 5}, "unknown JSON type"),
    ({"type": []}, "list of distinct"),
    ({"properties": []}, "properties"),
    ({"type": "object", "properties": {"a": {}}, "required": "a"}, "required"),
    ({"type": "array", "minItems": -1}, "minItems"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "maxItems"),
    ({"type": "string", "maxLength": 1.5}, "maxLength"),
    ({"enum": []}, "enum"),
    ({"anyOf": []}, "anyOf"),
    ({"$ref": "#/$defs/missing"}, "does not point"),
    ({"$ref": "https://example.com/s.json"}, "only local"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "pattern"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    (False, "false"),
    ("object", "must be an object"),
    ({"type": "integer", "minimum": 10, "maximum": 5}, "bounds"),
    ({"const": float("nan")}, "not a JSON value"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "left-recursive"),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": "1"}}}, "minimum"),
])
def test_invalid_schemas_raise_grammar_errors(schema, fragment):
    with pytest.raises(GrammarError, match=fragment):
        Grammar.from_json_schema(schema)


def malformed_schemas(count, seed=0):
    rng = random.Random(seed)
    def word():
        return "".join(rng.choice("abcxyz_") for _ in range(rng.randint(1, 8)))
    families = [
        lambda: {"type": word() + "s"},
        lambda: {"type": rng.choice([1, 2.5, None, {"a": 1}])} if rng.random() < 0.9 else {"type": ["string", "strin"]},
        lambda: {"type": "object", "properties": {word(): {"type": word() + "q"}}},
        lambda: {"type": "object", "properties": [word()]},
        lambda: {"type": "object", "required": {word(): 1}},
        lambda: {"type": "array", "minItems": -rng.randint(1, 9)},
        lambda: {"type": "array", "minItems": rng.randint(5, 9), "maxItems": rng.randint(0, 4)},
        lambda: {"type": "string", "minLength": rng.randint(5, 9), "maxLength": rng.randint(0, 4)},
        lambda: {"enum": []},
        lambda: {rng.choice(["anyOf", "oneOf", "allOf"]): []},
        lambda: {"$ref": f"#/$defs/{word()}"},
        lambda: {"$ref": f"http://example.com/{word()}.json"},
        lambda: {"type": "string", "pattern": word() + rng.choice(["(", "[", "(?=x)", "\\1", "{3,1}"])},
        lambda: {rng.choice(["not", "if", "contains", "propertyNames"]): {"type": "string"}},
        lambda: {"type": "integer", "minimum": rng.randint(10, 99), "maximum": rng.randint(0, 9)},
        lambda: {"type": "object", "properties": {word(): False}, "required": []} | {"required": None},
        lambda: {"$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"},
        lambda: rng.choice([False, 3, "object", [], None]),
        lambda: {"type": "array", "items": rng.choice([3, "x", None]) or 7},
        lambda: {"type": "object", "additionalProperties": rng.choice([1, "yes", [1]])},
        lambda: {"allOf": [{"properties": rng.choice([[1], "x", 3])}]},
        lambda: {"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}},
    ]
    return [families[i % len(families)]() for i in range(count)]


def test_ref_siblings_and_outer_constraints_are_enforced():
    schema = {"$defs": {"s": {"type": "string"}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 2},
                                               "b": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/s"}],
                                                     "minimum": 5}},
              "required": ["a", "b"]}
    grammar = Grammar.from_json_schema(schema)
    assert grammar.matches('{"a":"xy","b":7}') and grammar.matches('{"a":"","b":"q"}')
    assert not grammar.matches('{"a":"xyz","b":7}') and not grammar.matches('{"a":"x","b":4}')


def test_cyclic_refs_in_all_of_fail_instead_of_looping():
    schema = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]}
    with pytest.raises(GrammarError, match="cyclic"):
        Grammar.from_json_schema(schema)


@pytest.mark.parametrize("schema", [
    {"$ref": "#", "type": "object"},                                   # the root and a constraint
    {"$defs": {"a": {"$ref": "#/$defs/a", "minimum": 1}}, "$ref": "#/$defs/a"},
    {"allOf": [{"$ref": "#"}], "required": ["x"]},
], ids=["root", "def", "all-of"])
def test_a_ref_to_itself_beside_constraints_fails_instead_of_recursing(schema):
    """Each turn of the $ref brings its sibling constraints along as a new allOf to merge
    (it recursed until Python's limit: found by fuzzing schemas)."""
    with pytest.raises(GrammarError, match="allOf nested deeper|cyclic"):
        Grammar.from_json_schema(schema)


def test_two_hundred_malformed_schemas_are_rejected_quickly():
    schemas = malformed_schemas(200)
    start = time.perf_counter()
    for schema in schemas:
        with pytest.raises(GrammarError):
            Grammar.from_json_schema(schema)
    assert time.perf_counter() - start < 1.0


# ---- constrained sampling over a simulated vocabulary


def simulated_vocab(size=3000, seed=0):
    rng = random.Random(seed)
    pieces = [bytes([b]) for b in range(256)]
    pieces += [p.encode() for p in ['{"', '":', '",', '"}', '": "', ', "', "true", "false", "null", "[", "],", "{\n",
                                    "  ", "\n", "0.", "12", '"\n}', "name", "age", "kind", "circle", "é", "青"]]
    alphabet = 'abcdefghijklmnopqrstuvwxyz ABC0123456789_.,:"{}[]-\n'
    seen = set(pieces)
    while len(pieces) < size - 1:
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))).encode()
        if word not in seen:
            seen.add(word)
            pieces.append(word)
    pieces.append(b"</s>")
    return pieces


VOCAB = simulated_vocab()
EOS = len(VOCAB) - 1
CLOSERS = [VOCAB.index(p) for p in [b'"', b"}", b"]", b"0", b"1", b"true", b"null"]] + [EOS]


def generate(schema, options, seed, chain_hook=None):
    grammar = Grammar.from_json_schema(schema)
    chain = SamplerChain(options, len(VOCAB), VOCAB, [EOS], grammar)
    if chain_hook:
        chain_hook(chain)
    rng = np.random.default_rng(seed)
    out, tokens = b"", []
    for step in range(600):
        logits = (rng.standard_normal(len(VOCAB)) * 2).astype(np.float32)
        logits[CLOSERS] += step * 0.05          # push towards finishing as time goes on
        token = chain.sample(logits)
        chain.accept(token)
        tokens.append(token)
        if token == EOS:
            return out, tokens
        out += VOCAB[token]
    raise AssertionError(f"no end of generation: {out[:200]!r}")


@pytest.mark.parametrize("number", range(1, len(SCHEMAS) + 1))
def test_constrained_sampling_yields_valid_json(number):
    schema = SCHEMAS[number - 1]
    validator = validator_for(schema)
    for options in (SamplingOptions(seed=number), SamplingOptions(temperature=0),
                    SamplingOptions(seed=number, top_k=0, top_p=0.95, min_p=0.01)):
        out, _ = generate(schema, options, seed=number)
        value = json.loads(out.decode("utf-8"))
        errors = list(validator.iter_errors(value))
        assert not errors, (out, errors[0].message)


@pytest.mark.parametrize("options", [SamplingOptions(seed=5), SamplingOptions(temperature=0),
                                     SamplingOptions(seed=5, repeat_penalty=1.3, logit_bias={40: 3.0})])
def test_best_first_search_equals_full_masking(options):
    schema = SCHEMAS[1]
    fast, _ = generate(schema, options, seed=11)
    def force_mask(chain):
        chain._lazy_k = lambda: None
    slow, _ = generate(schema, options, seed=11, chain_hook=force_mask)
    assert fast == slow


def test_eog_only_when_the_grammar_can_end():
    grammar = Grammar.from_gbnf('root ::= ("a" | "b") "b"')
    pieces = [b"a", b"b", b"ab", b"</s>"]
    chain = SamplerChain(SamplingOptions(temperature=0), 4, pieces, [3], grammar)
    logits = np.array([0.0, 0.0, -1.0, 5.0], dtype=np.float32)
    assert chain.sample(logits) == 0             # EOG wins the raw argmax but the grammar is not done
    chain.accept(0)
    assert chain.sample(logits) == 1
    chain.accept(1)
    assert chain.sample(logits) == 3
    with pytest.raises(Exception, match="grammar"):
        SamplerChain(SamplingOptions(), 4, pieces, [3], grammar).accept(3)


def test_clone_forks_the_grammar_state():
    grammar = Grammar.from_gbnf('root ::= "a" ("b" | "c")')
    pieces = [b"a", b"b", b"c", b"</s>"]
    chain = SamplerChain(SamplingOptions(temperature=0), 4, pieces, [3], grammar)
    chain.accept(0)
    fork = chain.clone()
    chain.accept(1)
    assert fork.grammar_state.accepts(b"c") and not chain.grammar_state.accepts(b"c")
    assert fork.sample(np.array([0, 0, 1.0, 0], dtype=np.float32)) == 2


def random_schema(rng: random.Random, depth: int = 0) -> object:
    """A schema of random keywords with random values, valid or not."""
    if depth > 3 or rng.random() < 0.1:
        return rng.choice([True, False, {}, [], "string", 3, None])
    values = [0, -1, 2, 1.5, 10 ** 30, "x", "", True, None, [], {}, "#", "#/$defs/a", "#/nope", "^a+$"]
    schema: dict = {}
    for _ in range(rng.randint(0, 4)):
        key = rng.choice(["type", "properties", "required", "items", "minItems", "maxItems", "enum", "const",
                          "anyOf", "oneOf", "allOf", "$ref", "$defs", "additionalProperties", "minimum",
                          "maximum", "minLength", "maxLength", "pattern", "prefixItems", "not"])
        if key == "type":
            schema[key] = rng.choice(["object", "array", "string", "number", "integer", "boolean", "null",
                                      "nope", ["string", "null"], 5])
        elif key in ("properties", "$defs"):
            schema[key] = {n: random_schema(rng, depth + 1) for n in rng.sample("abc", rng.randint(0, 3))}
        elif key in ("items", "not", "additionalProperties"):
            schema[key] = random_schema(rng, depth + 1)
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            schema[key] = [random_schema(rng, depth + 1) for _ in range(rng.randint(0, 3))]
        elif key == "$ref":
            schema[key] = rng.choice(["#", "#/$defs/a", "#/$defs/b", "#/properties/a", "http://x"])
        else:
            schema[key] = rng.choice(values)
    return schema


def test_random_schemas_compile_or_fail_with_grammar_errors():
    """Seeded random schemas (valid, invalid, self-referring): each compiles to a grammar
    whose matcher can be walked, or is rejected with a GrammarError, quickly."""
    start, compiled = time.perf_counter(), 0
    for seed in range(400):
        rng = random.Random(seed)
        try:
            grammar = Grammar.from_json_schema(random_schema(rng))
        except GrammarError:
            continue
        compiled += 1
        matcher = grammar.matcher()
        for _ in range(30):
            allowed = matcher.next_bytes()
            if not allowed:
                break
            assert matcher.accept_bytes(bytes([rng.choice(allowed)]))
    assert 50 < compiled < 350 and time.perf_counter() - start < 20
