"""One function per input surface: ``one_<surface>(data)`` feeds one fuzz input to it.

A harness returns when the input was handled as it should be: accepted, or refused with
pyengine's typed error (bad input is expected, and refusing it is the right outcome).
It raises only on a defect: any other exception, a broken invariant (a streamed parse
that differs from the one-shot parse, a grammar output its schema refuses, a 5xx), or a
call that takes more than SLOW_S seconds of CPU.  fuzz/run.py drives them with atheris;
tests/test_fuzz_corpus.py replays the stored inputs through them without it.

Every harness is deterministic in its input: randomness (chunkings, walks) is seeded
from the input's bytes, so a stored input replays the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
FUZZ_DATA = TESTS / "data" / "fuzz"
SLOW_S = 2.0            # CPU seconds one input may take (a hang, past it)
SLOWDOWN = 1.0          # how much slower the code runs here: fuzz/run.py sets it under atheris
MAX_FORWARD_FILE = 1 << 20   # a GGUF that loads is run for one token only below this size

if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from pyengine.errors import GrammarError, PyEngineError  # noqa: E402

SURFACES = ("gguf", "tokenizer", "gbnf", "json_schema", "template", "parsers", "server")


class Defect(AssertionError):
    """What a harness raises when an input shows a defect (not a refusal)."""


@contextlib.contextmanager
def _bounded(what: str):
    """A Defect if the block takes more than SLOW_S seconds of the process's CPU time (all
    its threads: the server answers in others), scaled by SLOWDOWN.  CPU, not wall-clock,
    time: on a shared machine the wall clock runs several times faster than the work."""
    start = time.process_time()
    yield
    elapsed = (time.process_time() - start) / SLOWDOWN
    if elapsed > SLOW_S:
        raise Defect(f"{what} took {elapsed:.2f} s of CPU (> {SLOW_S} s)"
                     + (f", scaled down {SLOWDOWN:g}x for the instrumentation" if SLOWDOWN != 1 else ""))


def _rng(data: bytes) -> random.Random:
    return random.Random(hashlib.sha256(data).digest())


def _split(data: bytes) -> tuple[bytes, bytes]:
    head, _, tail = data.partition(b"\0")
    return head, tail


# ----------------------------------------------------------------------------- (1) GGUF

_SCRATCH = tempfile.mkdtemp(prefix="pyengine-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def one_gguf(data: bytes) -> None:
    """Open and validate the bytes as a GGUF file; read its metadata and tensor table;
    when a model loads from it, run one token through it."""
    from pyengine.gguf import GGUFFile

    path = os.path.join(_SCRATCH, "input.gguf")
    with open(path, "wb") as f:
        f.write(data)
    with _bounded("opening the GGUF"):
        try:
            gguf = GGUFFile(path)
        except PyEngineError:
            return
        try:
            for key in list(gguf.metadata)[:64]:
                gguf.metadata[key]
                if key.startswith("general."):
                    repr(gguf.metadata[key])
            for name in list(gguf.tensors)[:64]:
                info = gguf.tensors[name]
                assert info.offset + info.nbytes <= gguf.file_size, (name, info)
                gguf.tensor_data(name)
            with contextlib.suppress(PyEngineError):
                gguf.architecture
        finally:
            gguf.close()
    if len(data) <= MAX_FORWARD_FILE:
        _one_token(path)


def _one_token(path: str) -> None:
    from pyengine import LLM

    with _bounded("loading the model and running one token"):
        try:
            llm = LLM(path, n_ctx=16, n_threads=1, n_batch=8, n_parallel=1)
        except PyEngineError:
            return
        try:
            with contextlib.suppress(PyEngineError):
                llm.generate([0], max_tokens=1, temperature=0)
        finally:
            llm.close()


# ----------------------------------------------------------------------------- (2) tokenizers

# vocabularies of the llama.cpp suite (fetched by the tests): the four families
_SUITE = {"gpt-2": True, "llama-spm": True, "bert-bge": False, "nomic-bert-moe": False, "qwen2": True,
          "phi-3": True}
_SYNTH = ("llama-bpe-q5_1-tied", "llama-spm-q4_0")
_tokenizers: list[tuple[str, object, bool]] | None = None


def _load_tokenizers() -> list[tuple[str, object, bool]]:
    """(name, tokenizer, lossless) for every vocabulary the harness uses."""
    global _tokenizers
    if _tokenizers is None:
        from tokenizer_vocabs import bpe_metadata, spm_metadata

        from pyengine.tokenizer import Tokenizer

        found = [("spm-synthetic", Tokenizer.from_metadata(spm_metadata()), True),
                 ("bpe-synthetic", Tokenizer.from_metadata(bpe_metadata()), True)]
        for stem in _SYNTH:
            tok = Tokenizer.from_gguf(TESTS / "data" / "synth" / f"{stem}.gguf")
            found.append((stem, tok, _complete(tok)))
        try:
            import tokenizer_suite

            folder = tokenizer_suite.suite_dir()
        except Exception as exc:  # offline: the synthetic vocabularies only  # noqa: BLE001
            print(f"fuzz: llama.cpp's vocabularies unavailable ({exc}); synthetic ones only", file=sys.stderr)
        else:
            for name, lossless in _SUITE.items():
                found.append((name, Tokenizer.from_gguf(folder / f"ggml-vocab-{name}.gguf"), lossless))
        _tokenizers = found
    return _tokenizers


def _byte_level_merges(text: str, rng: random.Random) -> list[str]:
    from pyengine.tokenizer.bpe import BYTE_TO_CHAR

    chars = [BYTE_TO_CHAR[b] for b in text.encode("utf-8")[:64]]
    merges, made = [], set()
    pieces = list(chars)
    for _ in range(rng.randrange(1, 24)):
        if len(pieces) < 2:
            break
        i = rng.randrange(len(pieces) - 1)
        pair = f"{pieces[i]} {pieces[i + 1]}"
        if pair not in made and " " not in pieces[i] + pieces[i + 1]:
            made.add(pair)
            merges.append(pair)
            pieces[i:i + 2] = [pieces[i] + pieces[i + 1]]
    return merges


def _complete(tok) -> bool:
    """Whether a vocabulary can write every text: a byte-level BPE one needs all 256 byte
    characters (llama.cpp, too, drops a byte that has none); a SentencePiece one the "▁"
    piece (else the escaped space is byte-encoded, and decodes as "▁")."""
    from pyengine.tokenizer.bpe import BYTE_TO_CHAR

    if tok.vocab.family == "bpe":
        return all(char in tok.vocab.token_to_id for char in BYTE_TO_CHAR)
    return tok.vocab.family == "spm" and "▁" in tok.vocab.token_to_id


def one_tokenizer(data: bytes) -> None:
    """Encode and decode random text with each vocabulary family; lossless ones round-trip.
    data[0]: which vocabulary (or a random BPE one), parse_special, add_special."""
    if not data:
        return
    from pyengine.tokenizer import StreamDecoder, Tokenizer

    control, text = data[0], data[1:].decode("utf-8", "replace")
    rng = _rng(data)
    tokenizers = _load_tokenizers()
    pick = control % (len(tokenizers) + 1)
    if pick == len(tokenizers):
        from tokenizer_vocabs import bpe_metadata

        try:
            tok = Tokenizer.from_metadata(bpe_metadata(merges=_byte_level_merges(text, rng)))
        except PyEngineError:
            return
        name, lossless = "bpe-random", True
    else:
        name, tok, lossless = tokenizers[pick]
    parse_special, add_special = bool(control & 0x40), bool(control & 0x80)
    with _bounded(f"{name}: encoding {len(text)} characters"):
        ids = tok.encode(text, add_special=add_special, parse_special=parse_special)
        if not all(isinstance(i, int) and 0 <= i < tok.n_vocab for i in ids):
            raise Defect(f"{name}: ids out of range: {ids}")
        decoded = tok.decode(ids)
        if lossless and not parse_special and not add_special and decoded != text:
            raise Defect(f"{name}: decode(encode(text)) != text: {text!r} -> {ids} -> {decoded!r}")
        stream = StreamDecoder(tok)
        streamed = "".join(stream.push(i) for i in ids) + stream.flush()
        if streamed not in (decoded, " " + decoded):
            raise Defect(f"{name}: streamed decode {streamed!r} != decode {decoded!r}")
        # random ids decode (or are refused) without crashing
        with contextlib.suppress(PyEngineError):
            tok.decode([rng.randrange(-2, tok.n_vocab + 2) for _ in range(8)])


# ----------------------------------------------------------------------------- (3) GBNF

def one_gbnf(data: bytes) -> None:
    """Parse the text before the first NUL as GBNF; match what follows it; walk the
    automaton at random and check the walk's text matches."""
    from pyengine.sample.grammar import Grammar

    source, sample = _split(data)
    text = source.decode("utf-8", "replace")
    with _bounded("compiling and matching a grammar"):
        try:
            grammar = Grammar.from_gbnf(text)
        except PyEngineError:
            return
        try:
            _check_matcher(grammar, sample)
            _random_walk(grammar, _rng(data), steps=64)
        except GrammarError:
            return   # the matcher's bound on parallel parses (a hostile grammar): a typed refusal


def _check_matcher(grammar, sample: bytes) -> None:
    """Each byte the matcher takes must be among the next bytes it offered."""
    matcher = grammar.matcher()
    for byte in sample[:256]:
        offered = set(matcher.next_bytes())
        if not matcher.accepts(bytes([byte])):
            if byte in offered:
                raise Defect(f"byte {byte} offered by next_bytes() but refused")
            return
        if byte not in offered:
            raise Defect(f"byte {byte} taken but not offered by next_bytes() {sorted(offered)}")
        matcher.accept_bytes(bytes([byte]))
    matcher.forced_bytes()


def _random_walk(grammar, rng: random.Random, steps: int) -> bytes | None:
    """Bytes drawn from next_bytes() until the grammar can end (and the dice say stop),
    or None if the walk ran out of steps first; a finished walk must match."""
    matcher = grammar.matcher()
    out = bytearray()
    for _ in range(steps):
        if matcher.can_end() and (rng.random() < 0.25 or not matcher.next_bytes()):
            break
        offered = matcher.next_bytes()
        if not offered:
            if not matcher.can_end():
                raise Defect(f"a dead end after {bytes(out)!r}: nothing offered, and cannot end")
            break
        byte = rng.choice(offered)
        if not matcher.accept_bytes(bytes([byte])):
            raise Defect(f"byte {byte} offered after {bytes(out)!r} but refused")
        out.append(byte)
    else:
        return None
    if not grammar.matches(bytes(out)):
        raise Defect(f"the walk {bytes(out)!r} ended where the grammar can end, but does not match")
    return bytes(out)


# ----------------------------------------------------------------------------- (4) JSON schema

def one_json_schema(data: bytes) -> None:
    """A schema (the JSON before the first NUL) to a grammar; the grammar's random outputs
    must be JSON valid for the schema, and an instance (the JSON after the NUL) the schema
    validates must match when written compactly in the schema's key order."""
    from pyengine.sample.grammar import Grammar

    source, instance_text = _split(data)
    try:
        schema = json.loads(source)
    except (ValueError, RecursionError):
        return
    with _bounded("converting a schema and matching"):
        try:
            grammar = Grammar.from_json_schema(schema)
        except PyEngineError:
            return
        validator = _validator(schema)
        rng = _rng(data)
        for _ in range(3):
            try:
                out = _json_walk(grammar, rng)
            except GrammarError:
                return   # the matcher's bound on parallel parses
            if out is None:
                continue
            try:
                value = json.loads(out)
            except ValueError:
                raise Defect(f"the grammar produced {out!r}, which is no JSON") from None
            if validator is not None and not validator.is_valid(value):
                raise Defect(f"the grammar produced {out!r}, which the schema refuses")


def _validator(schema):
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema)
    except Exception:  # noqa: BLE001 - a schema jsonschema cannot check: no oracle
        return None


def _json_walk(grammar, rng: random.Random) -> bytes | None:
    """A random walk that prefers closing what it opened once it is long enough."""
    matcher = grammar.matcher()
    out = bytearray()
    for step in range(400):
        if matcher.can_end() and (step > 40 or rng.random() < 0.3):
            return bytes(out)
        offered = matcher.next_bytes()
        if not offered:
            return bytes(out) if matcher.can_end() else None
        closers = [b for b in offered if b in b'}]"']
        plain = [b for b in offered if b < 0x80] or offered
        pool = closers if closers and step > 40 and rng.random() < 0.8 else plain
        byte = rng.choice(pool)
        matcher.accept_bytes(bytes([byte]))
        out.append(byte)
    return None


# ----------------------------------------------------------------------------- (5) chat templates

class _Bytes:
    """Reads choices from the input's bytes (zeros once they run out)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def pick(self, options):
        return options[self.byte() % len(options)]

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


_NAMES = ("message", "m", "x", "loop", "ns", "tool", "messages", "tools", "bos_token", "eos_token",
          "add_generation_prompt", "range", "namespace", "raise_exception", "strftime_now", "cycler",
          "joiner", "lipsum", "self", "__class__", "_", "content")
_ATTRS = ("role", "content", "tool_calls", "index", "first", "last", "length", "items", "keys", "split",
          "strip", "startswith", "upper", "__class__", "__init__", "mro", "format", "append", "update",
          "function", "name", "arguments", "revindex0", "cycle", "value", "get")
_FILTERS = ("length", "tojson", "trim", "upper", "join", "default('d')", "string", "list", "first",
            "last", "reverse", "sort", "unique", "indent(2)", "replace('a', 'bb')", "items", "int",
            "safe", "e", "map(attribute='role')", "selectattr('role', 'equalto', 'user')", "batch(2)",
            "center(9999999)", "wordwrap(3)", "format(1)", "attr('__class__')", "sum", "max", "dictsort")
_LITERALS = ("0", "1", "-1", "2", "99999999", "'a'", "'<|im_start|>'", "\"x\"*4", "[]", "[1, 'a']",
             "{'k': 1}", "none", "true", "false", "''", "1.5", "(1, 2)")
_BINOPS = (" + ", " - ", " * ", " ~ ", " == ", " != ", " and ", " or ", " in ", " // ", " % ", " ** ", " < ")


def _expr(src: _Bytes, depth: int) -> str:
    kind = src.byte() % (9 if depth < 4 else 3)
    if kind == 0:
        return src.pick(_LITERALS)
    if kind in (1, 2):
        return src.pick(_NAMES)
    if kind == 3:
        return f"{_expr(src, depth + 1)}.{src.pick(_ATTRS)}"
    if kind == 4:
        return f"{_expr(src, depth + 1)}[{_expr(src, depth + 1)}]"
    if kind == 5:
        return f"({_expr(src, depth + 1)}{src.pick(_BINOPS)}{_expr(src, depth + 1)})"
    if kind == 6:
        return f"{_expr(src, depth + 1)} | {src.pick(_FILTERS)}"
    if kind == 7:
        args = ", ".join(_expr(src, depth + 1) for _ in range(src.byte() % 3))
        return f"{_expr(src, depth + 1)}({args})"
    return f"({_expr(src, depth + 1)} if {_expr(src, depth + 1)} else {_expr(src, depth + 1)})"


def _body(src: _Bytes, depth: int) -> str:
    parts = []
    for _ in range(1 + src.byte() % 4):
        if src.left <= 0:
            break
        kind = src.byte() % (10 if depth < 4 else 3)
        if kind == 0:
            parts.append(src.pick(("<|im_start|>", "\n", " ", "text", "{#c#}", "{{", "%}", "{%- ", "\\")))
        elif kind in (1, 2):
            parts.append("{{ " + _expr(src, depth) + " }}")
        elif kind == 3:
            parts.append(f"{{% for {src.pick(('m', 'x', 'k, v'))} in {_expr(src, depth)} %}}"
                         f"{_body(src, depth + 1)}{{% endfor %}}")
        elif kind == 4:
            parts.append(f"{{% if {_expr(src, depth)} %}}{_body(src, depth + 1)}"
                         f"{{% else %}}{_body(src, depth + 1)}{{% endif %}}")
        elif kind == 5:
            parts.append(f"{{% set {src.pick(('x', 'ns', 'ns.v', 'm'))} = {_expr(src, depth)} %}}")
        elif kind == 6:
            parts.append(f"{{% macro f{depth}(a) %}}{_body(src, depth + 1)}{{% endmacro %}}"
                         f"{{{{ f{depth}({_expr(src, depth)}) }}}}")
        elif kind == 7:
            parts.append(f"{{%- filter upper -%}}{_body(src, depth + 1)}{{%- endfilter -%}}")
        elif kind == 8:
            parts.append(f"{{% generation %}}{_body(src, depth + 1)}{{% endgeneration %}}")
        else:
            parts.append("{% set ns = namespace(v=0) %}{% for x in range(" + _expr(src, depth)
                         + ") %}{% set ns.v = ns.v + 1 %}" + _body(src, depth + 1) + "{% endfor %}")
    return "".join(parts)


_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <|im_end|> {{ x }}"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
    {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    {"role": "user", "content": [{"type": "text", "text": "parts"}]},
]
_TOOLS = [{"type": "function", "function": {"name": "f", "description": "d",
                                            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


def one_template(data: bytes) -> None:
    """A random template from a small grammar of Jinja constructs, rendered over a real
    context: it must end, in time, with text or a TemplateError."""
    from pyengine.chat.template import ChatTemplate
    from pyengine.errors import TemplateError

    src = _Bytes(data)
    template = _body(src, 0)
    if src.left > 0 and src.byte() % 4 == 0:   # the rest of the input, raw, appended
        template += data[src.pos:].decode("utf-8", "replace")
    messages = _MESSAGES[: 1 + src.byte() % len(_MESSAGES)]
    tools = _TOOLS if src.byte() % 2 else None
    with _bounded(f"rendering {template!r}"):
        try:
            compiled = ChatTemplate(template, bos_token="<s>", eos_token="</s>")
            out = compiled.render(messages, tools=tools, add_generation_prompt=bool(src.byte() % 2))
        except TemplateError:
            return
        if not isinstance(out, str):
            raise Defect(f"render returned {type(out).__name__}")


# ----------------------------------------------------------------------------- (6) output parsers

def _without_ids(parsed) -> tuple:
    calls = [{k: v for k, v in call.items() if k != "id"} for call in parsed.tool_calls]
    return parsed.content, parsed.reasoning, calls


def one_parsers(data: bytes) -> None:
    """A model's output parsed in one piece and streamed in random pieces: the same result.
    data[0]: tool format, reasoning, starts_in_reasoning; data[1] seeds the chunking."""
    if len(data) < 2:
        return
    from pyengine.chat.parsers import TOOL_FORMATS, collect, make_parser, parse_output

    control = data[0]
    text = data[2:].decode("utf-8", "replace")
    formats = (None,) + TOOL_FORMATS
    options = {"tool_format": formats[control % len(formats)], "reasoning": bool(control & 0x10),
               "starts_in_reasoning": bool(control & 0x20)}
    with _bounded("parsing a model's output"):
        whole = parse_output(text, **options)
        rng = random.Random(data[1])
        parser = make_parser(**options)
        deltas, pos = [], 0
        while pos < len(text):
            size = rng.choice((1, 1, 2, 3, 5, 8, 13, 64))
            deltas += parser.push(text[pos:pos + size])
            pos += size
        deltas += parser.finish()
        streamed = collect(deltas)
        if _without_ids(streamed) != _without_ids(whole):
            raise Defect(f"streamed {_without_ids(streamed)} != whole {_without_ids(whole)} for {text!r} {options}")


# ----------------------------------------------------------------------------- (7) the server

ROUTES = ("/api/chat", "/api/generate", "/api/embed", "/v1/chat/completions", "/v1/completions",
          "/v1/embeddings", "/api/show", "/api/create", "/v1/responses", "/api/embeddings", "/api/copy",
          "/api/delete", "/infill")
_client = None
_home: str | None = None


@contextlib.contextmanager
def _private_store():
    """The server's /api/create and /api/delete write to a store of their own while a
    request is handled (the process's own PYENGINE_HOME, the tests' models, stays as is)."""
    global _home
    if _home is None:
        _home = tempfile.mkdtemp(prefix="pyengine-fuzz-home-")
    before = os.environ.get("PYENGINE_HOME")
    os.environ["PYENGINE_HOME"] = _home
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYENGINE_HOME"]
        else:
            os.environ["PYENGINE_HOME"] = before


def _server_client():
    global _client
    if _client is None:
        from server_support import FakeAdapter, fake_loader
        from starlette.testclient import TestClient

        from pyengine.server import ServerConfig, create_app

        tiny = FUZZ_DATA / "gguf" / "seeds" / "tiny-llama.gguf"
        app = create_app(ServerConfig(), loader=fake_loader(FakeAdapter(pieces=2, delay_s=0)),
                         served={"fake": tiny})
        # as a local client would: the server refuses other hosts (DNS rebinding)
        _client = TestClient(app, base_url="http://127.0.0.1:11434", raise_server_exceptions=False)
        _client.__enter__()   # runs the lifespan once, for the process
    return _client


def server_response(data: bytes):
    """The app's answer to data[1:] POSTed (DELETEd to /api/delete) to the route data[0] picks."""
    route = ROUTES[data[0] % len(ROUTES)]
    method = "DELETE" if route == "/api/delete" else "POST"
    client = _server_client()   # started (once) outside the bound: the app's start-up is no request
    with _bounded(f"{method} {route}"), _private_store():
        return client.request(method, route, content=data[1:], headers={"content-type": "application/json"})


def one_server(data: bytes) -> None:
    """A random body sent to one route (data[0] picks it) of the app in-process, with a
    fake model: any answer below 500 is fine."""
    if not data:
        return
    response = server_response(data)
    if response.status_code >= 500:
        raise Defect(f"{response.request.method} {response.request.url.path} answered "
                     f"{response.status_code}: {response.text[:500]}")


HARNESSES = {name: globals()[f"one_{name}"] for name in SURFACES}


def load_modules() -> None:
    """Import what the harnesses import lazily, without running anything (fuzz/run.py
    instruments the loaded modules before any thread, such as the test client's, runs them)."""
    import importlib

    for name in ("pyengine.gguf", "pyengine.api", "pyengine.tokenizer", "pyengine.sample.grammar",
                 "pyengine.sample.json_schema", "pyengine.chat.template", "pyengine.chat.parsers",
                 "pyengine.server", "server_support", "tokenizer_vocabs", "starlette.testclient", "jsonschema"):
        importlib.import_module(name)
