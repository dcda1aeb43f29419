"""GGUFFile on valid files: agreement with gguf.GGUFReader, typed accessors, zero copy."""

from __future__ import annotations

import gc
import mmap
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from pyengine import gguf as gguf_module
from pyengine import hugepages
from pyengine.errors import GGUFError
from pyengine.gguf import MISSING, GGUFFile, StringArray, TensorInfo

SYNTH_DIR = Path(__file__).parent / "data" / "synth"
SYNTH_FILES = sorted(SYNTH_DIR.glob("*.gguf"))

_NUMPY_OF_VALUE_TYPE = {
    GGUFValueType.UINT8: np.uint8, GGUFValueType.INT8: np.int8,
    GGUFValueType.UINT16: np.uint16, GGUFValueType.INT16: np.int16,
    GGUFValueType.UINT32: np.uint32, GGUFValueType.INT32: np.int32,
    GGUFValueType.UINT64: np.uint64, GGUFValueType.INT64: np.int64,
    GGUFValueType.FLOAT32: np.float32, GGUFValueType.FLOAT64: np.float64,
    GGUFValueType.BOOL: np.bool_,
}


def test_synth_files_are_present():
    assert len(SYNTH_FILES) >= 19


# ---------------------------------------------------------------------------
# Agreement with the gguf package's reader on every synthetic model
# ---------------------------------------------------------------------------

def _assert_value_matches(key: str, mine: object, field) -> None:
    types = field.types
    expected = field.contents()
    if types[0] == GGUFValueType.ARRAY and types[-1] != GGUFValueType.STRING and len(types) == 2:
        assert isinstance(mine, np.ndarray), key
        assert mine.dtype == _NUMPY_OF_VALUE_TYPE[types[1]], key
        assert not mine.flags.writeable, key
        np.testing.assert_array_equal(mine, np.asarray(expected, dtype=mine.dtype), err_msg=key)
    elif types[0] == GGUFValueType.ARRAY and types[-1] == GGUFValueType.STRING:
        # string arrays decode on access (StringArray); nested ones are lists of them
        assert isinstance(mine, (list, StringArray)) and list(mine) == expected, key
    elif types[0] == GGUFValueType.BOOL:
        assert mine is bool(expected), key
    elif types[0] in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        assert isinstance(mine, float) and mine == pytest.approx(expected, rel=0, abs=0), key
    elif types[0] == GGUFValueType.STRING:
        assert isinstance(mine, str) and mine == expected, key
    else:
        assert type(mine) is int and mine == expected, key


@pytest.mark.parametrize("path", SYNTH_FILES, ids=lambda p: p.name)
def test_synth_file_matches_gguf_reader(path: Path):
    reader = GGUFReader(path)
    with GGUFFile(path) as f:
        reader_keys = [k for k in reader.fields if not k.startswith("GGUF.")]
        assert list(f.metadata) == reader_keys
        for key in reader_keys:
            _assert_value_matches(key, f.metadata[key], reader.fields[key])

        assert list(f.tensors) == [t.name for t in reader.tensors]
        assert f.version == 3
        assert f.alignment == reader.alignment
        assert f.data_offset == reader.data_offset
        assert f.file_size == path.stat().st_size
        for ref in reader.tensors:
            info = f.tensors[ref.name]
            assert info.type == int(ref.tensor_type)
            assert info.type_name == ref.tensor_type.name
            assert info.shape == tuple(int(d) for d in ref.shape)
            assert info.offset == ref.data_offset
            assert info.nbytes == ref.n_bytes
            assert info.n_elements == ref.n_elements
            data = f.tensor_data(ref.name)
            assert data.dtype == np.uint8 and data.shape == (info.nbytes,)
            assert data.tobytes() == np.ascontiguousarray(ref.data).tobytes()
        assert f.architecture == reader.fields["general.architecture"].contents()
        del data
    del reader
    gc.collect()


# ---------------------------------------------------------------------------
# Typed accessors, on a file written by GGUFWriter
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def typed_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("typed") / "typed.gguf"
    w = GGUFWriter(path, "testarch")
    w.add_uint32("testarch.context_length", 4096)
    w.add_uint8("k.u8", 200)
    w.add_int64("k.i64", -(2**40))
    w.add_uint64("k.u64", 2**63 + 5)
    w.add_float32("k.f32", 0.5)
    w.add_float64("k.f64", 1e-300)
    w.add_bool("k.bool", True)
    w.add_string("k.str", "héllo ✓")
    w.add_array("k.strs", ["a", "", "🙂"])
    w.add_key_value("k.i32s", [1, -2, 3], GGUFValueType.ARRAY, GGUFValueType.INT32)
    w.add_key_value("k.f32s", [0.25, 1.5], GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
    w.add_key_value("k.bools", [True, False, True], GGUFValueType.ARRAY, GGUFValueType.BOOL)
    w.add_key_value("k.nested", [[1, 2], [3]], GGUFValueType.ARRAY, GGUFValueType.ARRAY)
    w.add_tensor("t.f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("t.f16", np.arange(64, dtype=np.float16).reshape(2, 32))
    q8 = np.arange(2 * 34, dtype=np.uint8).reshape(2, 34)  # 2 rows of one Q8_0 block
    w.add_tensor("t.q8", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def typed(typed_file):
    with GGUFFile(typed_file) as f:
        yield f


def test_scalar_accessors(typed):
    assert typed.architecture == "testarch"
    assert typed.arch_key("context_length") == "testarch.context_length"
    assert typed.get_int(typed.arch_key("context_length")) == 4096
    assert typed.get_int("k.u8") == 200
    assert typed.get_int("k.i64") == -(2**40)
    assert typed.get_int("k.u64") == 2**63 + 5
    assert typed.get_float("k.f32") == 0.5
    assert typed.get_float("k.f64") == 1e-300
    value = typed.get_float("k.u8")  # ints are accepted as floats
    assert value == 200.0 and isinstance(value, float)
    assert typed.get_bool("k.bool") is True
    assert typed.get_str("k.str") == "héllo ✓"


def test_array_accessors(typed):
    assert typed.get_array("k.strs") == ["a", "", "🙂"]
    i32s = typed.get_array("k.i32s")
    assert i32s.dtype == np.int32 and i32s.tolist() == [1, -2, 3]
    f32s = typed.get_array("k.f32s")
    assert f32s.dtype == np.float32 and f32s.tolist() == [0.25, 1.5]
    bools = typed.get_array("k.bools")
    assert bools.dtype == np.bool_ and bools.tolist() == [True, False, True]
    nested = typed.get_array("k.nested")
    assert [a.tolist() for a in nested] == [[1, 2], [3]]


def test_numeric_arrays_are_read_only_views(typed):
    for key in ("k.i32s", "k.f32s"):
        values = typed.get_array(key)
        assert not values.flags.writeable
        assert not values.flags.owndata  # a view over the mmap, not a copy
        with pytest.raises(ValueError):
            values[0] = 7


def test_defaults_are_returned_only_for_missing_keys(typed):
    assert typed.get_str("no.such", "x") == "x"
    assert typed.get_int("no.such", 3) == 3
    assert typed.get_float("no.such", None) is None
    assert typed.get_bool("no.such", False) is False
    assert typed.get_array("no.such", []) == []
    with pytest.raises(GGUFError):
        typed.get_str("k.u8", "x")  # present with the wrong type: the default does not hide it
    assert repr(MISSING) == "MISSING"


@pytest.mark.parametrize("getter", ["get_str", "get_int", "get_float", "get_bool", "get_array"])
def test_missing_key_names_the_key(typed, getter):
    with pytest.raises(GGUFError, match=r"missing metadata key 'no\.such\.key'"):
        getattr(typed, getter)("no.such.key")


@pytest.mark.parametrize("getter, key, expected, actual", [
    ("get_int", "k.bool", "int", "bool"),
    ("get_int", "k.f32", "int", "float"),
    ("get_int", "k.str", "int", "str"),
    ("get_float", "k.bool", "float", "bool"),
    ("get_float", "k.str", "float", "str"),
    ("get_str", "k.u8", "str", "int"),
    ("get_str", "k.strs", "str", "array"),
    ("get_bool", "k.u8", "bool", "int"),
    ("get_array", "k.str", "array", "str"),
])
def test_wrong_type_names_key_expected_and_actual(typed, getter, key, expected, actual):
    with pytest.raises(GGUFError) as excinfo:
        getattr(typed, getter)(key)
    message = str(excinfo.value)
    assert repr(key) in message
    assert f"should be {expected}" in message
    assert f"it is {actual}" in message


def test_tensor_infos(typed):
    assert list(typed.tensors) == ["t.f32", "t.f16", "t.q8"]
    f32 = typed.tensors["t.f32"]
    assert isinstance(f32, TensorInfo)
    assert (f32.type, f32.type_name, f32.shape, f32.nbytes, f32.n_elements) == (0, "F32", (4, 3), 48, 12)
    assert f32.offset == typed.data_offset and f32.offset % typed.alignment == 0
    f16 = typed.tensors["t.f16"]
    assert (f16.type_name, f16.shape, f16.nbytes) == ("F16", (32, 2), 128)
    q8 = typed.tensors["t.q8"]
    assert (q8.type, q8.type_name, q8.shape, q8.nbytes) == (8, "Q8_0", (32, 2), 68)
    with pytest.raises(Exception):
        f32.name = "other"  # frozen


def test_tensor_data_is_a_read_only_view(typed):
    data = typed.tensor_data("t.f32")
    assert data.dtype == np.uint8 and not data.flags.writeable and not data.flags.owndata
    assert data.view(np.float32).tolist() == list(range(12))
    assert typed.tensor_data("t.f16").view(np.float16).tolist() == list(range(64))
    assert typed.tensor_data("t.q8").tolist() == list(range(68))
    with pytest.raises(ValueError):
        data[0] = 1


def test_tensor_data_of_unknown_name(typed):
    with pytest.raises(GGUFError, match=r"missing tensor 'blk\.0\.nope'"):
        typed.tensor_data("blk.0.nope")


def test_close_with_live_views_keeps_them_valid(typed_file):
    f = GGUFFile(typed_file)
    data = f.tensor_data("t.f32")
    ints = f.get_array("k.i32s")
    f.close()
    f.close()  # twice is fine
    assert data.view(np.float32).tolist() == list(range(12))
    assert ints.tolist() == [1, -2, 3]
    with pytest.raises(GGUFError, match="closed"):
        f.tensor_data("t.f32")
    assert f.get_int("k.u8") == 200  # parsed metadata stays usable
    del data, ints
    gc.collect()


def test_close_without_views_unmaps(tmp_path):
    path = tmp_path / "plain.gguf"
    w = GGUFWriter(path, "llama")  # no numeric arrays in the metadata: nothing exports the mmap
    w.add_tensor("a", np.ones(3, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f:
        mm = f._mmap
        assert f.tensor_data("a").view(np.float32).tolist() == [1.0] * 3
    assert f._mmap is None
    assert mm.closed


def test_mapping_is_released_with_the_last_view(typed_file):
    f = GGUFFile(typed_file)
    mm_ref = weakref.ref(f._mmap)
    data = f.tensor_data("t.f16")
    f.close()
    del f
    gc.collect()
    assert mm_ref() is not None  # the view still holds the mapping
    assert data.view(np.float16)[5] == 5
    del data
    gc.collect()
    assert mm_ref() is None


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> Path:
    """Tensor data past 2 MiB: large enough to be read into huge pages."""
    path = tmp_path_factory.mktemp("big") / "big.gguf"
    w = GGUFWriter(path, "llama")
    w.add_tensor("big", np.arange(1 << 20, dtype=np.float32))
    w.add_tensor("small", np.arange(7, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tensors_read_into_huge_pages_equal_the_mapping(big_file, monkeypatch):
    """Where Linux backs madvised memory with huge pages, a tensor is copied into them on
    its first request, a lookup table stays a view of the mapping (until the tensor is
    copied for another use); the bytes are the file's either way, read-only, and stay
    valid after close.  PYENGINE_MMAP=1 keeps every tensor a view of the mapping."""
    f = GGUFFile(big_file)
    assert f.huge_pages == gguf_module._huge_pages_wanted(f.file_size - f.data_offset)
    table = f.tensor_data("big", lookup=True)
    big, small = f.tensor_data("big"), f.tensor_data("small")
    assert f.tensor_data("big").ctypes.data == big.ctypes.data   # copied once
    assert (big.ctypes.data != table.ctypes.data) == f.huge_pages
    assert f.tensor_data("big", lookup=True).ctypes.data == big.ctypes.data
    assert not big.flags.writeable and not small.flags.writeable and not table.flags.writeable
    f.close()
    monkeypatch.setenv("PYENGINE_MMAP", "1")
    with GGUFFile(big_file) as g:
        assert not g.huge_pages
        assert np.array_equal(g.tensor_data("big"), big) and np.array_equal(g.tensor_data("small"), small)
    assert np.array_equal(big.view(np.float32), np.arange(1 << 20, dtype=np.float32))
    assert np.array_equal(table, big)
    assert small.view(np.float32).tolist() == list(range(7))


@pytest.mark.parametrize("mmap_only", ["0", "1"])
def test_transformed_tensor_is_rewritten_once_and_lookups_keep_the_file(big_file, monkeypatch, mmap_only):
    """tensor_data(transform=) rewrites a tensor's bytes into memory of its own (the
    huge-page copy's place, or a private buffer with PYENGINE_MMAP=1), once; asked for
    again without the transform (a lookup, say) the tensor reads the file's bytes."""
    monkeypatch.setenv("PYENGINE_MMAP", mmap_only)
    calls = []

    def reverse(src: np.ndarray, dst: np.ndarray) -> None:
        calls.append(len(src))
        dst[:] = src[::-1]

    with GGUFFile(big_file) as f:
        plain = np.arange(1 << 20, dtype=np.float32).view(np.uint8)
        done = f.tensor_data("big", transform=reverse)
        assert np.array_equal(done, plain[::-1]) and not done.flags.writeable
        assert f.tensor_data("big", transform=reverse).ctypes.data == done.ctypes.data and calls == [plain.size]
        for lookup in (True, False):
            assert np.array_equal(f.tensor_data("big", lookup=lookup), plain)
        assert f.tensor_data("small").view(np.float32).tolist() == list(range(7))
        copied = f.tensor_data("small")   # copied as it is first, then transformed: the copy stays
        assert np.array_equal(f.tensor_data("small", transform=reverse), copied[::-1])
        assert copied.view(np.float32).tolist() == list(range(7))
    assert np.array_equal(done, plain[::-1])   # still valid after close


@pytest.mark.parametrize("mmap_only", ["0", "1"])
def test_transform_by_units_reads_the_file_a_piece_at_a_time(big_file, monkeypatch, mmap_only):
    """With a `unit`, the tensor is read and transformed a few whole units at a time (a
    repacked table gets no second copy beside it while loading); the result is the
    whole transform's."""
    monkeypatch.setenv("PYENGINE_MMAP", mmap_only)
    monkeypatch.setattr(gguf_module, "_TRANSFORM_PIECE", 50001)   # pieces of 3125 units of 16
    pieces = []

    def reverse_units(src: np.ndarray, dst: np.ndarray) -> None:
        pieces.append(len(src))
        dst.reshape(-1, 16)[:] = src.reshape(-1, 16)[:, ::-1]

    with GGUFFile(big_file) as f:
        plain = np.arange(1 << 20, dtype=np.float32).view(np.uint8)
        done = f.tensor_data("big", transform=reverse_units, unit=16)
        assert np.array_equal(done, plain.reshape(-1, 16)[:, ::-1].reshape(-1))
        assert sum(pieces) == plain.size and pieces[0] == 50000 and pieces[-1] == plain.size % 50000


def test_huge_pages_by_default_only_up_to_a_size(monkeypatch):
    """Huge pages cost load time: tensor data past 1 GiB stays mapped unless
    PYENGINE_MMAP=0 asks for the copy; PYENGINE_MMAP=1 maps everything."""
    large = gguf_module._HUGE_DEFAULT_MAX + 1
    monkeypatch.delenv("PYENGINE_MMAP", raising=False)
    small_copied = gguf_module._huge_pages_wanted(4 << 20)
    assert not gguf_module._huge_pages_wanted(large)
    monkeypatch.setenv("PYENGINE_MMAP", "0")
    assert gguf_module._huge_pages_wanted(large) == (small_copied and large <= hugepages.available_memory() // 2)
    monkeypatch.setenv("PYENGINE_MMAP", "1")
    assert not gguf_module._huge_pages_wanted(4 << 20)


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="huge pages are a Linux feature")
def test_tensor_of_a_file_cut_short_after_parsing_is_an_error(big_file):
    """A copy reads the file again: a file cut short since it was parsed is a GGUFError
    (a view of the mapping past the end would crash the process when read)."""
    with GGUFFile(big_file) as f:
        buf, start = hugepages.arena(4096)
        with memoryview(buf) as whole:
            gguf_module._read_into(f.path, f.data_offset, whole[start:start + 64])
            assert bytes(buf[start:start + 64]) == bytes(f.tensor_data("big")[:64])
            with pytest.raises(GGUFError, match="truncated"):
                gguf_module._read_into(f.path, f.file_size - 32, whole[start:start + 64])


def test_path_like_and_custom_alignment(tmp_path):
    path = tmp_path / "aligned.gguf"
    w = GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    w.add_tensor("a", np.ones(3, dtype=np.float32))
    w.add_tensor("b", np.full(5, 2.0, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f:
        assert f.path == str(path)
        assert f.alignment == 64
        assert [t.offset % 64 for t in f.tensors.values()] == [0, 0]
        assert f.tensor_data("b").view(np.float32).tolist() == [2.0] * 5


def test_file_without_architecture(tmp_path):
    path = tmp_path / "noarch.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    with GGUFFile(path) as f:
        assert f.metadata == {} and f.tensors == {}
        with pytest.raises(GGUFError, match="general.architecture"):
            _ = f.architecture


# ---------------------------------------------------------------------------
# Speed: a Gemma-3-sized vocabulary (262,144 tokens)
# ---------------------------------------------------------------------------

def test_large_vocabulary_parses_quickly(tmp_path):
    n_vocab = 262144
    tokens = [f"▁tok{i}" if i % 3 else f"<0x{i % 256:02X}>" for i in range(n_vocab)]
    path = tmp_path / "vocab.gguf"
    w = GGUFWriter(path, "gemma3")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(np.linspace(-1, 0, n_vocab, dtype=np.float32).tolist())
    w.add_token_types(np.ones(n_vocab, dtype=np.int32).tolist())
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    start = time.perf_counter()
    f = GGUFFile(path)
    elapsed = time.perf_counter() - start
    assert f.get_array("tokenizer.ggml.tokens") == tokens
    scores = f.get_array("tokenizer.ggml.scores")
    assert scores.dtype == np.float32 and scores.shape == (n_vocab,) and not scores.flags.owndata
    assert f.get_array("tokenizer.ggml.token_type").shape == (n_vocab,)
    assert elapsed < 2.0, f"header parse took {elapsed:.3f}s"
    f.close()
