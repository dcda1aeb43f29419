"""JSON Schema -> GBNF, so constrained generation yields JSON that validates.

Supported: type (and lists of types), properties / required / additionalProperties (false,
true or a schema), items / prefixItems / minItems / maxItems, enum, const, string
minLength / maxLength, pattern (a regex subset, see regex_gbnf.py) and format date / time /
date-time / uuid, integer bounds (exact),
number bounds (integer-valued; values generated conservatively inside them), boolean,
null, $ref to #/$defs, #/definitions or any local pointer (recursion allowed), anyOf /
oneOf (as alternatives), allOf of object schemas (merged). Properties come out in the
order the schema gives. Keywords that constrain values in ways the grammar cannot
express (not, if/then/else, multipleOf, uniqueItems, ...) raise GrammarError
rather than being ignored: the converter fails closed.

Whitespace: compact JSON, at most one space after each ``:`` and ``,`` and none anywhere
else (no newlines, no indents). llama.cpp's converter allows a space or newlines and up to
20 indents at every token boundary; a small model spends a token or more on each (SmolLM2
wrote a one-argument object in 14-19 tokens, a forced tool call in 45-83), so a tight
``max_tokens`` cut replies off. One optional space keeps both of the usual spellings
(``{"a":1}`` and ``{"a": 1}``) that models are trained on.
"""

from __future__ import annotations

import json
import math
import re
from typing import Mapping

from pyengine.errors import GrammarError
from pyengine.sample.gbnf import MAX_REPETITION
from pyengine.sample.regex_gbnf import pattern_to_gbnf
from pyengine.sample.schema_rules import (
    BUILTINS, FORMATS, class_char, decimals_within, gbnf_literal, int_range, json_text, json_type_matches,
    nat_range, repeat)

__all__ = ["JSON_OBJECT_GRAMMAR", "int_range", "nat_range", "schema_to_grammar"]

MAX_DEPTH = 64

_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")
# Keywords whose constraints a grammar cannot (or we do not) enforce: fail closed.
_UNSUPPORTED = ("not", "if", "then", "else", "patternProperties", "dependentRequired",
                "dependentSchemas", "dependencies", "propertyNames", "unevaluatedProperties",
                "unevaluatedItems", "contains", "minContains", "maxContains", "multipleOf",
                "maxProperties", "$dynamicRef", "$recursiveRef")
_NAME_JUNK = re.compile(r"[^a-zA-Z0-9-]+")


def schema_to_grammar(schema: Mapping[str, object] | bool) -> str:
    """GBNF text (root rule `root`) for JSON documents valid under `schema`."""
    return _Converter(schema).run()


def _object_grammar() -> str:
    converter = _Converter(True)
    converter.rules["root"] = converter.builtin("object")
    return converter.render()


# ---- the converter


class _Converter:
    def __init__(self, schema: object) -> None:
        self.schema = schema
        self.rules: dict[str, str | None] = {}
        self.refs: dict[str, str] = {}

    def run(self) -> str:
        expression = self.visit(self.schema, "root", 0, "#")
        if expression != "root":
            self.rules["root"] = expression
        return self.render()

    def render(self) -> str:
        return "\n".join(f"{name} ::= {body}" for name, body in self.rules.items())

    # rules

    def add(self, name: str, body: str) -> str:
        name = _NAME_JUNK.sub("-", name).strip("-") or "rule"
        candidate, suffix = name, 0
        while candidate in self.rules and self.rules[candidate] != body:
            suffix += 1
            candidate = f"{name}-{suffix}"
        self.rules[candidate] = body
        return candidate

    def builtin(self, name: str) -> str:
        if name not in self.rules:
            body, deps = BUILTINS[name]
            self.rules[name] = body
            for dep in deps:
                self.builtin(dep)
        return name

    # dispatch

    def visit(self, schema: object, name: str, depth: int, path: str) -> str:
        if depth > MAX_DEPTH:
            raise GrammarError(f"schema nested deeper than {MAX_DEPTH} levels at {path}")
        if schema is True:
            return self.builtin("value")
        if schema is False:
            raise GrammarError(f"schema at {path} is false: no value can satisfy it")
        if not isinstance(schema, Mapping):
            raise GrammarError(f"schema at {path} must be an object or a boolean, got {type(schema).__name__}")
        _check_supported(schema, path)
        if "$ref" in schema:
            siblings = _constraints(schema, "$ref")
            if siblings:   # constraints next to a $ref apply too: merge them like allOf
                return self.visit({"allOf": [{"$ref": schema["$ref"]}, siblings]}, name, depth + 1, path)
            return self.reference(schema["$ref"], depth, path)
        if "const" in schema:
            return self.add(name, gbnf_literal(json_text(schema["const"], f"{path}/const")))
        if "enum" in schema:
            return self.enum(schema, name, path)
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                return self.union(schema, keyword, name, depth, path)
        if "allOf" in schema:
            return self.visit(self.merge_all_of(schema, path, depth), name, depth + 1, path)
        return self.typed(schema, name, depth, path)

    def typed(self, schema: Mapping, name: str, depth: int, path: str) -> str:
        kind = schema.get("type")
        if "type" in schema and not isinstance(kind, (str, list)):
            raise GrammarError(f"{path}/type: unknown JSON type {kind!r} (expected one of {', '.join(_TYPES)})")
        if isinstance(kind, list):
            if not kind or any(t not in _TYPES for t in kind) or len(set(kind)) != len(kind):
                raise GrammarError(f"{path}/type: {kind!r} is not a list of distinct JSON types")
            alternatives = [self.visit({**schema, "type": t}, f"{name}-{t}", depth + 1, path) for t in kind]
            return self.add(name, " | ".join(alternatives))
        if kind is None:
            kind = _infer_type(schema)
        elif kind not in _TYPES:
            raise GrammarError(f"{path}/type: unknown JSON type {kind!r} (expected one of {', '.join(_TYPES)})")
        if kind == "object":
            return self.object(schema, name, depth, path)
        if kind == "array":
            return self.array(schema, name, depth, path)
        if kind == "string":
            return self.string(schema, name, path)
        if kind in ("integer", "number"):
            return self.numeric(schema, kind, name, path)
        if kind in ("boolean", "null"):
            return self.builtin(kind)
        return self.builtin("value")

    # combinators

    def reference(self, ref: object, depth: int, path: str) -> str:
        if not isinstance(ref, str):
            raise GrammarError(f"{path}/$ref must be a string, got {ref!r}")
        known = self.refs.get(ref)
        if known is not None:
            return known
        target = _resolve_pointer(self.schema, ref, path)
        rule = self.add("ref-" + (ref.rsplit("/", 1)[-1] or "root"), "")
        self.refs[ref] = rule
        self.rules[rule] = self.visit(target, f"{rule}-value", depth + 1, ref)
        return rule

    def enum(self, schema: Mapping, name: str, path: str) -> str:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise GrammarError(f"{path}/enum must be a non-empty list")
        kind = schema.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            values = [v for v in values if any(json_type_matches(v, t) for t in kinds)]
            if not values:
                raise GrammarError(f"{path}: no enum value has the schema's type {kind!r}")
        texts = dict.fromkeys(gbnf_literal(json_text(v, f"{path}/enum")) for v in values)
        return self.add(name, " | ".join(texts))

    def union(self, schema: Mapping, keyword: str, name: str, depth: int, path: str) -> str:
        options = schema[keyword]
        if not isinstance(options, list) or not options:
            raise GrammarError(f"{path}/{keyword} must be a non-empty list of schemas")
        outer = _constraints(schema, keyword)
        alternatives = []
        for i, option in enumerate(options):
            if outer:
                option = {"allOf": [outer, option]}   # the outer constraints apply to every branch
            alternatives.append(self.visit(option, f"{name}-{i}", depth + 1, f"{path}/{keyword}/{i}"))
        return self.add(name, " | ".join(dict.fromkeys(alternatives)))

    def merge_all_of(self, schema: Mapping, path: str, depth: int) -> dict:
        if depth > MAX_DEPTH:   # an allOf whose $ref leads back to it nests without end
            raise GrammarError(f"{path}: allOf nested deeper than {MAX_DEPTH} levels (or through a $ref to itself)")
        parts = schema["allOf"]
        if not isinstance(parts, list) or not parts:
            raise GrammarError(f"{path}/allOf must be a non-empty list of schemas")
        merged: dict = {k: v for k, v in schema.items() if k != "allOf"}
        for i, part in enumerate(parts):
            part = self.dereference(part, f"{path}/allOf/{i}")
            if part is True:
                continue
            if not isinstance(part, Mapping):
                raise GrammarError(f"{path}/allOf/{i} must be a schema object")
            if "allOf" in part:
                part = self.merge_all_of(part, f"{path}/allOf/{i}", depth + 1)
            for key, value in part.items():
                if key in _ANNOTATIONS:
                    continue
                if key == "properties":
                    props = dict(_check_properties(merged.get("properties", {}), path))
                    for prop, sub in _check_properties(value, f"{path}/allOf/{i}").items():
                        if prop in props and props[prop] != sub:
                            raise GrammarError(f"{path}/allOf: property {prop!r} is defined twice differently")
                        props[prop] = sub
                    merged["properties"] = props
                elif key == "required":
                    merged["required"] = list(dict.fromkeys([*_check_required(merged.get("required", []), path),
                                                             *_check_required(value, f"{path}/allOf/{i}")]))
                elif key in merged and merged[key] != value:
                    raise GrammarError(f"{path}/allOf: conflicting values for {key!r} cannot be merged")
                else:
                    merged[key] = value
        return merged

    def dereference(self, schema: object, path: str) -> object:
        """Follow a chain of bare $refs (bounded, so a cycle fails instead of looping)."""
        for _ in range(MAX_DEPTH):
            if not (isinstance(schema, Mapping) and "$ref" in schema):
                return schema
            ref = schema["$ref"]
            if not isinstance(ref, str):
                raise GrammarError(f"{path}/$ref must be a string, got {ref!r}")
            rest = _constraints(schema, "$ref")
            schema = _resolve_pointer(self.schema, ref, path)
            if rest:
                return {"allOf": [schema, rest]}
        raise GrammarError(f"{path}: $ref chain too long or cyclic")

    # objects

    def object(self, schema: Mapping, name: str, depth: int, path: str) -> str:
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        required = schema.get("required", [])
        if props is None and extra is None and not required:
            return self.builtin("object")   # {"type": "object"}: any object
        props = _check_properties({} if props is None else props, path)
        required = _check_required(required, path)
        order = list(props) + [key for key in required if key not in props]
        members = {}
        for key in order:
            value = self.visit(props.get(key, True), f"{name}-{key}", depth + 1, f"{path}/properties/{key}")
            members[key] = self.add(f"{name}-{key}-kv",
                                    f'{gbnf_literal(json_text(key, path))} ":" space {value}')
        extra_member = self.additional_member(extra, order, name, depth, path)
        body = self.members([(key, key in required) for key in order], members, extra_member, name)
        return self.add(name, _sequence('"{"', body, '"}"'))

    def additional_member(self, extra: object, declared: list[str], name: str, depth: int,
                          path: str) -> str | None:
        if extra is None or extra is False:
            return None
        if extra is not True and not isinstance(extra, Mapping):
            raise GrammarError(f"{path}/additionalProperties must be a boolean or a schema")
        value = self.visit(extra, f"{name}-additional-value", depth + 1, f"{path}/additionalProperties")
        key = self.add(f"{name}-additional-key", self.not_strings(declared)) if declared \
            else self.builtin("string")
        self.builtin("space")
        return self.add(f"{name}-additional-kv", f'{key} ":" space {value}')

    def members(self, items: list[tuple[str, bool]], members: dict[str, str], extra: str | None,
                name: str) -> str:
        """Members in the given order, optional ones skippable, commas only between present ones.

        after[i]: the members from i on, once some member was written (each needs a comma);
        first[i]: the members from i on, none written yet.
        """
        self.builtin("space")
        after = f'("," space {extra})*' if extra else ""
        first = f"({extra} {after})?" if extra else ""
        for i in range(len(items) - 1, -1, -1):
            key, is_required = items[i]
            member = members[key]
            if is_required:
                after_i = f'"," space {member} {after}'
                first_i = f"{member} {after}"
            else:
                after_i = f'("," space {member})? {after}'
                first_i = f"{member} {after} | {first}" if first else f"({member} {after})?"
            after = self.add(f"{name}-after-{i}", after_i.strip())
            first = self.add(f"{name}-first-{i}", first_i.strip())
        return first

    def not_strings(self, words: list[str]) -> str:
        """A JSON string (with its quotes) equal to none of `words`."""
        self.builtin("char")
        trie: dict = {}
        for word in words:
            node = trie
            for char in word:
                node = node.setdefault(char, {})
            node[None] = True
        return f'"\\"" ({self._not_strings_node(trie)}) "\\""'

    def _not_strings_node(self, node: dict) -> str:
        children = sorted(k for k in node if k is not None)
        alternatives = []
        for char in children:
            literal = gbnf_literal(json.dumps(char, ensure_ascii=False)[1:-1])
            alternatives.append(f"{literal} ({self._not_strings_node(node[char])})")
        # Diverge here with a character that is no child: escapes that could spell a child
        # (and every \u escape) are left out, so no declared word can sneak through.
        banned = "".join(class_char(c) for c in children)
        alternatives.append(f'[^"\\\\\\x7F\\x00-\\x1F{banned}] char*')
        escapes = "".join(e for e, c in _ESCAPE_CHARS.items() if c not in children)
        if escapes:
            alternatives.append(f'[\\\\] [{"".join(class_char(e) for e in escapes)}] char*')
        if None not in node:
            alternatives.append("")   # a proper prefix of a word is itself not a word
        return " | ".join(alternatives)

    # arrays

    def array(self, schema: Mapping, name: str, depth: int, path: str) -> str:
        low = _count(schema, "minItems", path) or 0
        high = _count(schema, "maxItems", path)
        if high is not None and high < low:
            raise GrammarError(f"{path}: maxItems {high} is below minItems {low}")
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        extra = items
        if isinstance(items, list):           # draft-4 tuples: items + additionalItems
            prefix, extra = items, schema.get("additionalItems")
        if prefix is not None and not isinstance(prefix, list):
            raise GrammarError(f"{path}/prefixItems must be a list of schemas")
        if extra is not None and not isinstance(extra, (bool, Mapping)):
            raise GrammarError(f"{path}/items must be a schema")
        self.builtin("space")
        prefix = prefix or []
        taken = len(prefix) if high is None else min(len(prefix), high)
        parts = [self.visit(sub, f"{name}-{i}", depth + 1, f"{path}/prefixItems/{i}")
                 for i, sub in enumerate(prefix[:taken])]
        extra_low = max(0, low - taken)
        extra_high = None if high is None else high - taken
        if prefix and extra is None:
            extra, extra_high = True, extra_low   # unspecified extras: only as many as required
        if extra is False:
            if extra_low:
                raise GrammarError(f"{path}: minItems {low} needs more items than the tuple allows")
            extra_high = 0
        body = " \",\" space ".join(parts)
        if extra_high != 0:
            item = self.visit(True if extra is None else extra, f"{name}-item", depth + 1, f"{path}/items")
            body = self.item_list(body, item, extra_low, extra_high)
        return self.add(name, _sequence('"["', body, '"]"'))

    def item_list(self, head: str, item: str, low: int, high: int | None) -> str:
        """`head` then low..high more items, comma-separated (head may be empty)."""
        high = None if high is not None and high > MAX_REPETITION else high
        if low > MAX_REPETITION:
            raise GrammarError(f"cannot require more than {MAX_REPETITION} array items")
        if head:
            return f'{head} ("," space {item}){repeat(low, high)}' if (low, high) != (0, 0) else head
        rest = repeat(max(low - 1, 0), None if high is None else high - 1)
        listed = f'{item} ("," space {item}){rest}' if rest != "{0}" else item
        return listed if low >= 1 else f"({listed})?"

    # scalars

    def string(self, schema: Mapping, name: str, path: str) -> str:
        low = _count(schema, "minLength", path) or 0
        high = _count(schema, "maxLength", path)
        if high is not None and high < low:
            raise GrammarError(f"{path}: maxLength {high} is below minLength {low}")
        form = schema.get("format")
        if form is not None and not isinstance(form, str):
            raise GrammarError(f"{path}/format must be a string")
        if "pattern" in schema:
            if low or high is not None or form is not None:
                raise GrammarError(f"{path}: 'pattern' together with lengths or a format is not supported")
            return self.add(name, f'"\\"" ({pattern_to_gbnf(schema["pattern"])}) "\\""')
        if form in FORMATS:
            if low or high is not None:
                raise GrammarError(f"{path}: minLength/maxLength with format {form!r} is not supported")
            return self.builtin(f"{form}-string")
        if low == 0 and high is None:
            return self.builtin("string")
        if low > MAX_REPETITION:
            raise GrammarError(f"{path}: minLength above {MAX_REPETITION} is not supported")
        high = None if high is not None and high > MAX_REPETITION else high
        self.builtin("char")
        return self.add(name, f'"\\"" char{repeat(low, high)} "\\""')

    def numeric(self, schema: Mapping, kind: str, name: str, path: str) -> str:
        low, high = _integer_bounds(schema, path)
        if low is None and high is None:
            return self.builtin(kind)
        if low is not None and high is not None and low > high:
            raise GrammarError(f"{path}: no {kind} satisfies the bounds (after rounding: {low} > {high})")
        parts = [int_range(low, high)]
        if kind == "number":
            self.builtin("decimal-part")
            parts += decimals_within(low, high)
        return self.add(name, " | ".join(p for p in parts if p))


# ---- helpers for the converter

_ANNOTATIONS = frozenset(("title", "description", "default", "examples", "$schema", "$id", "$comment",
                          "deprecated", "readOnly", "writeOnly", "$anchor", "$defs", "definitions",
                          "contentEncoding", "contentMediaType"))
_ESCAPE_CHARS = {"\"": "\"", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _sequence(*parts: str) -> str:
    return " ".join(part for part in parts if part)


def _constraints(schema: Mapping, without: str) -> dict:
    """The keywords of a schema that constrain values, except `without`."""
    return {k: v for k, v in schema.items() if k != without and k not in _ANNOTATIONS}


def _check_supported(schema: Mapping, path: str) -> None:
    for keyword in _UNSUPPORTED:
        if keyword in schema:
            raise GrammarError(f"{path}: JSON schema keyword {keyword!r} is not supported")
    if schema.get("uniqueItems") is True:
        raise GrammarError(f"{path}: JSON schema keyword 'uniqueItems' is not supported")
    if schema.get("minProperties", 0) not in (0, None):
        raise GrammarError(f"{path}: JSON schema keyword 'minProperties' is not supported")


def _infer_type(schema: Mapping) -> str | None:
    if any(k in schema for k in ("properties", "additionalProperties", "required")):
        return "object"
    if any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems")):
        return "array"
    # as llama.cpp does, an untyped pattern is a string's: else any value would be allowed
    # and the pattern ignored
    if any(k in schema for k in ("minLength", "maxLength", "format", "pattern")):
        return "string"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return None


def _check_properties(props: object, path: str) -> dict:
    if not isinstance(props, Mapping) or any(not isinstance(k, str) for k in props):
        raise GrammarError(f"{path}/properties must map property names to schemas")
    return dict(props)


def _check_required(required: object, path: str) -> list[str]:
    if not isinstance(required, list) or any(not isinstance(k, str) for k in required):
        raise GrammarError(f"{path}/required must be a list of property names")
    return list(dict.fromkeys(required))


def _count(schema: Mapping, keyword: str, path: str) -> int | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GrammarError(f"{path}/{keyword} must be a non-negative integer, got {value!r}")
    return value


def _bound(schema: Mapping, keyword: str, path: str) -> float | None:
    value = schema.get(keyword)
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GrammarError(f"{path}/{keyword} must be a finite number, got {value!r}")
    return value


def _integer_bounds(schema: Mapping, path: str) -> tuple[int | None, int | None]:
    """Integer bounds inside the schema's (possibly fractional, possibly exclusive) bounds."""
    lows, highs = [], []
    minimum, maximum = _bound(schema, "minimum", path), _bound(schema, "maximum", path)
    ex_min, ex_max = _bound(schema, "exclusiveMinimum", path), _bound(schema, "exclusiveMaximum", path)
    if minimum is not None:
        # draft 4: exclusiveMinimum true makes the minimum itself excluded
        lows.append(math.floor(minimum) + 1 if schema.get("exclusiveMinimum") is True else math.ceil(minimum))
    if maximum is not None:
        highs.append(math.ceil(maximum) - 1 if schema.get("exclusiveMaximum") is True else math.floor(maximum))
    if ex_min is not None:
        lows.append(math.floor(ex_min) + 1)
    if ex_max is not None:
        highs.append(math.ceil(ex_max) - 1)
    return (max(lows) if lows else None), (min(highs) if highs else None)


def _resolve_pointer(root: object, ref: str, path: str) -> object:
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        raise GrammarError(f"{path}: unsupported $ref {ref!r} (only local references like '#/$defs/name')")
    target = root
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(target, Mapping) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise GrammarError(f"{path}: $ref {ref!r} does not point into the schema (no {part!r})")
    return target


JSON_OBJECT_GRAMMAR = _object_grammar()
