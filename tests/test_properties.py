"""Property tests (hypothesis): invariants that must hold for every input, not just the
cases the other tests write out.

- tokenizers: decode(encode(s)) == s on lossless vocabularies (byte-level BPE, and
  SentencePiece with byte fallback and the "▁" piece);
- grammars: every string a grammar's automaton lets a sampler produce parses, checked
  independently (json.loads and the schema's validator, a regular expression);
- block types: quantize -> dequantize stays within each type's error bound;
- the KV cache's cell table: no cell is ever given twice, under random edit sequences.

Deterministic in CI: derandomized, no example database.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_vocabs import bpe_metadata, spm_metadata

from pyengine import _core
from pyengine.errors import InvalidOptionError
from pyengine.kvcache.cells import CellTable
from pyengine.sample import Grammar
from pyengine.tokenizer import Tokenizer

FAST = settings(max_examples=60, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
SYNTH = Path(__file__).parent / "data" / "synth"

# ---------------------------------------------------------------- tokenizers

LOSSLESS = {
    "spm-synthetic": Tokenizer.from_metadata(spm_metadata(extra={"▁▁": (-1.5, 1)})),
    "bpe-synthetic": Tokenizer.from_metadata(bpe_metadata()),
    "bpe-llama3": Tokenizer.from_metadata(bpe_metadata(pre="llama3")),
}
# (the synthetic models' 512-token vocabulary lacks some byte characters: not lossless)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)


@pytest.mark.parametrize("name", LOSSLESS)
@FAST
@given(text=TEXT)
def test_decode_inverts_encode(name, text):
    tok = LOSSLESS[name]
    ids = tok.encode(text)
    assert all(0 <= i < tok.n_vocab for i in ids)
    assert tok.decode(ids) == text


@FAST
@given(text=st.text(alphabet="ab c中\n", max_size=40))
def test_control_tokens_in_text_round_trip_as_text(text):
    """Without parse_special, "<s>" written in the text is text, and comes back as such."""
    tok = LOSSLESS["spm-synthetic"]
    text = text.replace("c", "<s>")
    assert tok.decode(tok.encode(text)) == text


# ---------------------------------------------------------------- grammars

def walk(grammar: Grammar, choices, soft: int = 40, hard: int = 400) -> bytes | None:
    """Bytes a constrained sampler could produce: any offered byte (drawn), ending where
    the grammar allows once past `soft` bytes, closing brackets and quotes preferred then."""
    matcher = grammar.matcher()
    out = bytearray()
    for step in range(hard):
        offered = matcher.next_bytes()
        if matcher.can_end() and (not offered or step >= soft or choices(3) == 0):
            return bytes(out)
        assert offered, f"a dead end after {bytes(out)!r}"
        closing = [b for b in offered if b in b'}]"']
        ascii_ = [b for b in offered if b < 0x80] or offered
        pool = closing if closing and step >= soft else ascii_
        byte = pool[choices(len(pool))]
        assert matcher.accept_bytes(bytes([byte]))
        out.append(byte)
    return None


def drawer(data):
    return lambda n: data.draw(st.integers(0, n - 1))


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 3}},
     "required": ["name"], "additionalProperties": False},
    {"type": "array", "items": {"type": "number", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    {"anyOf": [{"type": "string", "pattern": "^[a-c]{2}x?$"}, {"type": "boolean"}, {"type": "null"}]},
    {"type": "object", "additionalProperties": {"type": "integer", "exclusiveMinimum": 10}},
    {"type": "string", "minLength": 2, "maxLength": 5},
    {"enum": [{"k": [1, "é"]}, "\n", -0.5, None]},
]
# (not format "date": its grammar is RFC 3339's syntax, which allows year 0000 and
# 2023-02-31; jsonschema's checker, Python's date, refuses them)
GRAMMARS = [Grammar.from_json_schema(schema) for schema in SCHEMAS]


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
@FAST
@given(data=st.data())
def test_schema_constrained_outputs_validate(index, data):
    text = walk(GRAMMARS[index], drawer(data))
    if text is None:
        return
    value = json.loads(text.decode("utf-8"))
    jsonschema.Draft202012Validator(SCHEMAS[index], format_checker=jsonschema.FormatChecker()).validate(value)


JSON_ANY = Grammar.json_object()


@FAST
@given(data=st.data())
def test_json_object_outputs_parse(data):
    text = walk(JSON_ANY, drawer(data), soft=60)
    if text is not None:
        assert isinstance(json.loads(text.decode("utf-8")), dict)


ARITH = Grammar.from_gbnf('root ::= num (op num)*\nop ::= " + " | "*"\nnum ::= "-"? [1-9] [0-9]{0,3} | "(" root ")"')
ARITH_FLAT = re.compile(r"-?[1-9][0-9]{0,3}((?: \+ |\*)-?[1-9][0-9]{0,3})*")


@FAST
@given(data=st.data())
def test_gbnf_outputs_are_in_the_language(data):
    """An independent check of the language: parenthesised groups reduced away, the rest
    is a regular expression's."""
    text = walk(ARITH, drawer(data), soft=30)
    if text is None:
        return
    flat = text.decode()
    while "(" in flat:
        inner = re.sub(r"\(([^()]*)\)", lambda m: "1" if ARITH_FLAT.fullmatch(m.group(1)) else "!", flat)
        assert inner != flat, flat
        flat = inner
    assert ARITH_FLAT.fullmatch(flat), text


@FAST
@given(text=st.text(alphabet="1209-+*() ", max_size=30))
def test_gbnf_refuses_what_is_not_in_the_language(text):
    """The other way round: a string the regular expression refuses (without groups) does not match."""
    if "(" in text or ")" in text:
        return
    assert ARITH.matches(text) == bool(ARITH_FLAT.fullmatch(text))


# ---------------------------------------------------------------- block types

# largest |dequantize(quantize(x)) - x| in a block, relative to the block's largest |x|.
# Legacy types: half a step of their scale (a whole step where the scale's sign puts the
# extreme value past the top code: Q4_0, Q5_0), plus the scale's f16 rounding; the others
# (sub-block scales quantized themselves, non-linear grids) measured worst cases, with margin.
BLOCK_BOUND = {
    "Q8_0": 1 / 254 + 2e-3, "Q8_1": 1 / 254 + 2e-3, "Q4_0": 1 / 8 + 2e-3, "Q4_1": 1 / 15 + 2e-3,
    "Q5_0": 1 / 16 + 2e-3, "Q5_1": 1 / 31 + 2e-3, "Q8_K": 1 / 254 + 2e-3, "IQ4_NL": 0.2, "IQ4_XS": 0.2,
    "Q2_K": 0.6, "Q3_K": 0.4, "Q4_K": 0.2, "Q5_K": 0.1, "Q6_K": 0.05,
    # the scale puts amax in [8, 16) halves of it, the top level is 12: at most a quarter of amax
    "MXFP4": 0.25 + 2e-3,
}
# element-wise relative bounds of the float types (their rounding)
FLOAT_BOUND = {"F32": 0.0, "F16": 2.0 ** -11, "BF16": 2.0 ** -8}
TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9, "Q2_K": 10,
            "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "IQ4_NL": 20, "IQ4_XS": 23, "BF16": 30,
            "MXFP4": 39}


@st.composite
def rows(draw, n: int):
    """n floats in blocks of different scales: gaussian-like, constant, sparse or with outliers."""
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "uniform", "constant", "sparse", "outliers", "tiny"]))
    x = rng.standard_normal(n) if kind != "uniform" else rng.uniform(-1, 1, n)
    if kind == "constant":
        x[:] = draw(st.floats(-100, 100))
    elif kind == "sparse":
        x[rng.random(n) < 0.9] = 0.0
    elif kind == "outliers":
        x[rng.integers(0, n, 3)] *= 40.0
    elif kind == "tiny":
        x *= 1e-3
    x *= np.repeat(rng.uniform(0.01, 50.0, n // 32), 32)
    return x.astype(np.float32)


@pytest.mark.parametrize("name", sorted(BLOCK_BOUND))
@FAST
@given(x=rows(512))
def test_block_round_trip_error_is_bounded(name, x):
    qtype = TYPE_IDS[name]
    block = _core.block_size(qtype)
    y = _core.dequantize(qtype, _core.quantize(qtype, x), x.size)
    err = np.abs(y.astype(np.float64) - x).reshape(-1, block).max(axis=1)
    amax = np.abs(x.astype(np.float64)).reshape(-1, block).max(axis=1)
    worst = np.max(err - BLOCK_BOUND[name] * amax)
    assert worst <= 1e-6, (name, float(np.max(err / np.maximum(amax, 1e-30))))


@pytest.mark.parametrize("name", sorted(FLOAT_BOUND))
@FAST
@given(x=rows(64))
def test_float_round_trip_error_is_bounded(name, x):
    qtype = TYPE_IDS[name]
    y = _core.dequantize(qtype, _core.quantize(qtype, x), x.size).astype(np.float64)
    tiny = 2.0 ** -24 if name == "F16" else 0.0   # f16's subnormal spacing
    assert np.all(np.abs(y - x) <= FLOAT_BOUND[name] * np.abs(x) + tiny)


# ---------------------------------------------------------------- KV cache cells

N_CELLS, N_SEQ = 24, 4
EDITS = st.lists(st.tuples(st.sampled_from(["add", "decode", "remove", "copy", "compact", "unshare", "shift"]),
                           st.integers(0, N_SEQ - 1), st.integers(0, N_SEQ - 1), st.integers(1, 6),
                           st.integers(0, 12)), max_size=40)


def check_table(table: CellTable, model: dict[int, list[int]]) -> None:
    """The table holds exactly the model's positions, each once per sequence, in cell order."""
    assert np.all(table.pos[table.seq == 0] == -1)
    assert not np.any(table.seq[table.top:])
    for sid in range(N_SEQ):
        cells = table.cells_of(sid)
        positions = table.pos[cells].tolist()
        assert positions == sorted(model[sid]), (sid, positions, model[sid])
        assert len(set(positions)) == len(positions)
        assert table.last_cell(sid) == (int(cells[-1]) if cells.size else -1)
    assert table.n_used + table.n_free == table.n_cells


@FAST
@given(edits=EDITS)
def test_cells_are_never_given_twice(edits):
    table = CellTable(N_CELLS)
    model: dict[int, list[int]] = {sid: [] for sid in range(N_SEQ)}
    for op, sid, other, count, p0 in edits:
        if op in ("add", "decode"):
            n = 1 if op == "decode" else count
            start = (max(model[sid]) + 1) if model[sid] else 0
            positions = np.arange(start, start + n, dtype=np.int32)
            ids = np.full(n, sid, np.int32)
            if op == "decode":
                cells = table.plan_decode([sid], [start])
                slots = None if cells is None else np.array(cells, np.int32)
            else:
                slots = None
            if slots is None:
                slots = table.plan(positions, ids)
            if slots is None:   # the owner compacts, then plans again
                order = table.compaction()
                table.rebuild(order, table.seq[order].copy())
                slots = table.plan(positions, ids)
            if slots is None:
                assert table.n_free < n
                continue
            assert len(set(slots.tolist())) == n, slots
            assert np.all(table.seq[slots] == 0), "a cell in use was planned again"
            table.record(slots, positions, ids)
            model[sid] += positions.tolist()
        elif op == "remove":
            table.remove(sid, p0, p0 + count)
            model[sid] = [p for p in model[sid] if not p0 <= p < p0 + count]
        elif op == "copy":
            if sid == other:
                continue
            if model[other]:
                with pytest.raises(InvalidOptionError):
                    table.copy(sid, other, 0, p0)
                continue
            table.copy(sid, other, 0, p0)
            model[other] = [p for p in model[sid] if p < p0]
        elif op == "compact":
            order = table.compaction()
            table.rebuild(order, table.seq[order].copy())
        elif op == "unshare":
            shared = table.shared_cells(sid, p0)
            if shared.size and table.n_used + shared.size <= N_CELLS:
                table.rebuild(*table.unshare_order(sid, shared))
        elif op == "shift" and model[sid]:
            if table.shared_cells(sid, p0).size:
                continue
            below = [p for p in model[sid] if p < p0]
            delta = -min(count, p0 - (max(below) + 1 if below else 0))
            table.shift(sid, p0, delta)
            model[sid] = [p + delta if p >= p0 else p for p in model[sid]]
        check_table(table, model)
