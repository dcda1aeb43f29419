"""GGUFFile on bad input: every defect is a typed error that says what and where.

Corrupt files are assembled byte by byte in tmp_path by the small builder below,
so each test states exactly which field is wrong.
"""

from __future__ import annotations

import os
import random
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFWriter

from pyengine.errors import GGUFError, ModelNotFoundError
from pyengine.gguf import GGUFFile

# Value type ids of the GGUF format.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
F32_TYPE, Q8_0_TYPE = 0, 8


# ---------------------------------------------------------------------------
# Builder
# ---------------------------------------------------------------------------

def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw) if length is None else length) + raw


def kv(key: str | bytes, value_type: int, payload: bytes) -> bytes:
    return gstr(key) + u32(value_type) + payload


def kv_str(key: str, value: str) -> bytes:
    return kv(key, STR, gstr(value))


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, U32, u32(value))


def array(elem_type: int, count: int, payload: bytes) -> bytes:
    return u32(elem_type) + u64(count) + payload


def tensor_info(name: str, dims: list[int], type_id: int, offset: int) -> bytes:
    return gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(type_id) + u64(offset)


def gguf_bytes(kvs: list[bytes] = (), tensors: list[bytes] = (), data: bytes = b"", *,
               n_kv: int | None = None, n_tensors: int | None = None, version: int = 3,
               magic: bytes = b"GGUF", alignment: int = 32) -> bytes:
    header = magic + u32(version)
    header += u64(len(tensors) if n_tensors is None else n_tensors)
    header += u64(len(kvs) if n_kv is None else n_kv)
    body = header + b"".join(kvs) + b"".join(tensors)
    if tensors or data:
        body += bytes(-len(body) % alignment)
    return body + data


def f32_data(n: int) -> bytes:
    return np.arange(n, dtype=np.float32).tobytes()


def valid_parts() -> tuple[list[bytes], list[bytes], bytes]:
    """A small, valid file exercising every kind of field."""
    kvs = [
        kv_str("general.architecture", "llama"),
        kv_u32("llama.context_length", 128),
        kv("k.f32", F32, struct.pack("<f", 0.5)),
        kv("k.bool", BOOL, b"\x01"),
        kv("k.strs", ARR, array(STR, 3, gstr("a") + gstr("") + gstr("bcd"))),
        kv("k.i32s", ARR, array(I32, 3, struct.pack("<3i", 1, -2, 3))),
        kv("k.nested", ARR, array(ARR, 2, array(U8, 2, b"\x01\x02") + array(STR, 1, gstr("x")))),
        kv_u32("general.alignment", 32),
    ]
    tensors = [
        tensor_info("a", [8], F32_TYPE, 0),
        tensor_info("b", [32, 2], Q8_0_TYPE, 32),
    ]
    data = f32_data(8) + bytes(range(68))
    return kvs, tensors, data


def write(tmp_path: Path, content: bytes, name: str = "bad.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def load_error(tmp_path: Path, content: bytes) -> str:
    path = write(tmp_path, content)
    with pytest.raises(GGUFError) as excinfo:
        GGUFFile(path)
    return str(excinfo.value)


def test_builder_makes_a_valid_file(tmp_path):
    kvs, tensors, data = valid_parts()
    with GGUFFile(write(tmp_path, gguf_bytes(kvs, tensors, data))) as f:
        assert f.architecture == "llama"
        assert f.get_array("k.strs") == ["a", "", "bcd"]
        assert f.get_array("k.nested")[1] == ["x"]
        assert f.tensors["b"].nbytes == 68
        assert f.tensor_data("a").view(np.float32).tolist() == list(range(8))


# ---------------------------------------------------------------------------
# Paths that are not GGUF files
# ---------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError):
        GGUFFile(str(tmp_path / "nope.gguf"))


def test_directory(tmp_path):
    with pytest.raises(GGUFError, match="is a directory"):
        GGUFFile(tmp_path)


def test_device_is_not_a_regular_file():
    with pytest.raises(GGUFError, match="not a regular file"):
        GGUFFile(os.devnull)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX only")
def test_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(GGUFError, match="not a regular file"):
        GGUFFile(fifo)


def test_empty_file(tmp_path):
    assert "truncated" in load_error(tmp_path, b"")


def test_text_file(tmp_path):
    message = load_error(tmp_path, b"this is not a model, just some text\n" * 4)
    assert "not a GGUF file" in message and "b'this'" in message


def test_bad_magic(tmp_path):
    kvs, tensors, data = valid_parts()
    assert "not a GGUF file" in load_error(tmp_path, gguf_bytes(kvs, tensors, data, magic=b"GGUG"))


def test_version_1(tmp_path):
    message = load_error(tmp_path, gguf_bytes(version=1))
    assert "version 1" in message and "not supported" in message


def test_unknown_version(tmp_path):
    assert "unsupported GGUF version 7" in load_error(tmp_path, gguf_bytes(version=7))


def test_version_2_is_read(tmp_path):
    kvs, tensors, data = valid_parts()
    with GGUFFile(write(tmp_path, gguf_bytes(kvs, tensors, data, version=2))) as f:
        assert f.version == 2 and len(f.tensors) == 2


def test_big_endian_file(tmp_path):
    path = tmp_path / "be.gguf"
    w = GGUFWriter(path, "llama", endianess=GGUFEndian.BIG)
    w.add_tensor("a", np.ones(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="big-endian"):
        GGUFFile(path)


# ---------------------------------------------------------------------------
# Truncation anywhere, and random corruption
# ---------------------------------------------------------------------------

def test_every_truncation_is_a_gguf_error(tmp_path):
    kvs, tensors, data = valid_parts()
    content = gguf_bytes(kvs, tensors, data)
    path = tmp_path / "cut.gguf"
    for cut in range(len(content)):
        path.write_bytes(content[:cut])
        with pytest.raises(GGUFError) as excinfo:
            GGUFFile(path)
        assert "truncated" in str(excinfo.value), (cut, str(excinfo.value))


def test_truncations_of_a_writer_file(tmp_path):
    source = Path(__file__).parent / "data" / "synth" / "llama-spm-q4_0.gguf"
    content = source.read_bytes()
    path = tmp_path / "cut.gguf"
    for cut in list(range(0, len(content), 997)) + [len(content) - 1]:
        path.write_bytes(content[:cut])
        with pytest.raises(GGUFError, match="truncated"):
            GGUFFile(path)


def test_truncated_message_says_where(tmp_path):
    kvs, tensors, data = valid_parts()
    content = gguf_bytes(kvs, tensors, data)
    last = len(kvs) - 1
    cut = 24 + sum(len(entry) for entry in kvs[:last]) + 5  # inside the length of the last key
    message = load_error(tmp_path, content[:cut])
    assert "file is truncated" in message and f"key of metadata entry #{last}" in message
    assert f"file ends at {cut}" in message


def test_random_corruption_gives_only_gguf_errors(tmp_path):
    kvs, tensors, data = valid_parts()
    content = gguf_bytes(kvs, tensors, data)
    header_len = len(content) - len(data)
    rng = random.Random(1234)
    path = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(400):
        mutated = bytearray(content)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(header_len)] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        path.write_bytes(bytes(mutated))
        try:
            GGUFFile(path).close()
            outcomes["ok"] += 1
        except GGUFError:
            outcomes["error"] += 1
    assert outcomes["error"] > 100


# ---------------------------------------------------------------------------
# Counts and lengths that the file cannot hold: rejected before allocating
# ---------------------------------------------------------------------------

def _peak_bytes_while_loading(path: Path) -> int:
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError):
            GGUFFile(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_absurd_kv_count(tmp_path):
    kvs, tensors, data = valid_parts()
    path = write(tmp_path, gguf_bytes(kvs, tensors, data, n_kv=2**60))
    assert _peak_bytes_while_loading(path) < 1_000_000
    message = load_error(tmp_path, gguf_bytes(kvs, tensors, data, n_kv=2**60))
    assert f"{2**60} metadata entries" in message


def test_absurd_tensor_count(tmp_path):
    kvs, tensors, data = valid_parts()
    path = write(tmp_path, gguf_bytes(kvs, tensors, data, n_tensors=2**60))
    assert _peak_bytes_while_loading(path) < 1_000_000
    assert f"{2**60} tensors" in load_error(tmp_path, gguf_bytes(kvs, tensors, data, n_tensors=2**60))
    assert f"{2**64 - 1} tensors" in load_error(tmp_path, gguf_bytes(kvs, tensors, data, n_tensors=2**64 - 1))


def test_counts_just_past_the_file(tmp_path):
    # Small counts that still cannot fit: 3 entries of at least 13 bytes in 20 bytes.
    assert "corrupt counts" in load_error(tmp_path, gguf_bytes(n_kv=3) + bytes(20))


def test_absurd_key_length(tmp_path):
    message = load_error(tmp_path, gguf_bytes([gstr("general.architecture", length=2**60) + bytes(20)]))
    assert "truncated" in message and "key of metadata entry #0" in message


def test_absurd_string_value_length(tmp_path):
    content = gguf_bytes([kv("general.name", STR, gstr("x", length=2**60))])
    path = write(tmp_path, content)
    assert _peak_bytes_while_loading(path) < 1_000_000
    assert "'general.name'" in load_error(tmp_path, content)


@pytest.mark.parametrize("elem_type", [U8, I32, F64, STR, ARR, BOOL])
def test_absurd_array_length(tmp_path, elem_type):
    content = gguf_bytes([kv("tokenizer.ggml.tokens", ARR, array(elem_type, 2**60, bytes(64)))])
    path = write(tmp_path, content)
    assert _peak_bytes_while_loading(path) < 1_000_000
    message = load_error(tmp_path, content)
    assert "'tokenizer.ggml.tokens'" in message and str(2**60) in message


def test_array_length_overflowing_64_bits(tmp_path):
    # count * 8 wraps around in 64-bit arithmetic; here it must simply be too large.
    content = gguf_bytes([kv("k", ARR, array(U64, 2**61 + 1, bytes(64)))])
    assert "claims" in load_error(tmp_path, content)


def test_string_inside_array_past_end(tmp_path):
    content = gguf_bytes([kv("k.strs", ARR, array(STR, 2, gstr("ok") + gstr("x", length=1000) + bytes(8)))])
    message = load_error(tmp_path, content)
    assert "truncated" in message and "'k.strs'[1]" in message


def test_deeply_nested_arrays(tmp_path):
    nested = array(U8, 0, b"")
    for _ in range(50):
        nested = array(ARR, 1, nested)
    assert "nests arrays deeper" in load_error(tmp_path, gguf_bytes([kv("k.deep", ARR, nested)]))


# ---------------------------------------------------------------------------
# Metadata defects
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("value_type", [13, 99, 2**32 - 1])
def test_unknown_value_type(tmp_path, value_type):
    message = load_error(tmp_path, gguf_bytes([kv("k.odd", value_type, bytes(16))]))
    assert "'k.odd'" in message and f"unknown value type {value_type}" in message


def test_unknown_array_element_type(tmp_path):
    message = load_error(tmp_path, gguf_bytes([kv("k.arr", ARR, array(42, 1, bytes(16)))]))
    assert "'k.arr'" in message and "unknown element type 42" in message


def test_duplicate_key(tmp_path):
    message = load_error(tmp_path, gguf_bytes([kv_u32("a.b", 1), kv_u32("c", 2), kv_u32("a.b", 3)]))
    assert "duplicate metadata key 'a.b'" in message and "#2" in message


def test_key_not_utf8(tmp_path):
    assert "not valid UTF-8" in load_error(tmp_path, gguf_bytes([kv(b"bad\xff", U32, u32(1))]))


def test_value_string_with_invalid_utf8_keeps_its_bytes(tmp_path):
    content = gguf_bytes([kv("k.s", STR, gstr(b"a\xffb")), kv("k.v", ARR, array(STR, 1, gstr(b"\xe2\x82")))])
    with GGUFFile(write(tmp_path, content)) as f:
        assert f.get_str("k.s").encode("utf-8", "surrogateescape") == b"a\xffb"
        assert f.get_array("k.v")[0].encode("utf-8", "surrogateescape") == b"\xe2\x82"


@pytest.mark.parametrize("alignment", [0, 3, 48, 2**31 + 1])
def test_alignment_not_a_power_of_two(tmp_path, alignment):
    message = load_error(tmp_path, gguf_bytes([kv_u32("general.alignment", alignment)]))
    assert "general.alignment" in message and "power of two" in message and str(alignment) in message


def test_alignment_of_wrong_type(tmp_path):
    message = load_error(tmp_path, gguf_bytes([kv_str("general.alignment", "32")]))
    assert "general.alignment must be an integer" in message


# ---------------------------------------------------------------------------
# Tensor info defects
# ---------------------------------------------------------------------------

def _one_tensor(dims: list[int], type_id: int = F32_TYPE, offset: int = 0, data: bytes = bytes(4096),
                alignment_kv: list[bytes] = ()) -> bytes:
    return gguf_bytes(list(alignment_kv), [tensor_info("blk.0.w", dims, type_id, offset)], data)


@pytest.mark.parametrize("type_id", [4, 5, 31, 1000, 2**32 - 1])
def test_unknown_tensor_type(tmp_path, type_id):
    message = load_error(tmp_path, _one_tensor([32], type_id))
    assert "'blk.0.w'" in message and f"unknown GGML type id {type_id}" in message


def test_zero_sized_dimension(tmp_path):
    message = load_error(tmp_path, _one_tensor([32, 0]))
    assert "'blk.0.w'" in message and "dimension < 1" in message


@pytest.mark.parametrize("dims", [[1, 1, 1, 1, 1], []])
def test_wrong_number_of_dimensions(tmp_path, dims):
    message = load_error(tmp_path, _one_tensor(dims))
    assert "'blk.0.w'" in message and f"has {len(dims)} dimensions" in message


def test_absurd_n_dims_is_not_read_as_dims(tmp_path):
    content = gguf_bytes([], [gstr("t") + u32(2**31) + bytes(64)])
    assert "2147483648 dimensions" in load_error(tmp_path, content)


def test_too_many_elements(tmp_path):
    message = load_error(tmp_path, _one_tensor([2**32, 2**31]))
    assert "'blk.0.w'" in message and "past 2**62" in message


def test_too_many_bytes(tmp_path):
    f64_type = 28  # 8 bytes per element: 2**60 elements fit the element limit, not the byte one
    message = load_error(tmp_path, _one_tensor([2**30, 2**30], f64_type))
    assert "'blk.0.w'" in message and "bytes" in message and "past 2**62" in message


def test_dims_product_past_64_bits(tmp_path):
    assert "past 2**62" in load_error(tmp_path, _one_tensor([2**63, 2**63, 2**63, 2**63]))


def test_row_not_a_multiple_of_the_block(tmp_path):
    message = load_error(tmp_path, _one_tensor([48, 2], Q8_0_TYPE))
    assert "'blk.0.w'" in message and "Q8_0" in message and "ne0=48" in message


def test_misaligned_offset(tmp_path):
    message = load_error(tmp_path, _one_tensor([4], offset=16))
    assert "'blk.0.w'" in message and "offset 16" in message and "alignment 32" in message


def test_misaligned_offset_with_custom_alignment(tmp_path):
    content = _one_tensor([4], offset=32, alignment_kv=[kv_u32("general.alignment", 64)])
    assert "alignment 64" in load_error(tmp_path, content)


def test_tensor_data_past_end_of_file(tmp_path):
    message = load_error(tmp_path, _one_tensor([1024, 2], data=bytes(4096)))  # needs 8192
    assert "truncated" in message and "'blk.0.w'" in message


def test_tensor_offset_far_past_end(tmp_path):
    message = load_error(tmp_path, _one_tensor([4], offset=2**63))
    assert "truncated" in message and "'blk.0.w'" in message


def test_duplicate_tensor_name(tmp_path):
    tensors = [tensor_info("w", [8], F32_TYPE, 0), tensor_info("w", [8], F32_TYPE, 32)]
    message = load_error(tmp_path, gguf_bytes([], tensors, bytes(64)))
    assert "duplicate tensor name 'w'" in message and "#1" in message


@pytest.mark.parametrize(("offsets", "pair"), [
    ((0, 0), ("a", "b")),            # the same bytes
    ((0, 32, 64), ("b", "c")),       # b's 64 bytes run into c
    ((128, 0, 32), ("b", "c")),      # listed out of order: found once sorted by offset
])
def test_overlapping_tensor_data(tmp_path, offsets, pair):
    sizes = {"a": 8, "b": 16, "c": 8}   # f32 elements: 32, 64, 32 bytes
    names = list(sizes)[:len(offsets)]
    tensors = [tensor_info(name, [sizes[name]], F32_TYPE, offset) for name, offset in zip(names, offsets)]
    message = load_error(tmp_path, gguf_bytes([], tensors, bytes(256)))
    assert "overlap" in message and f"{pair[0]!r}" in message and f"{pair[1]!r}" in message


def test_adjacent_and_gapped_tensors_load(tmp_path):
    tensors = [tensor_info("a", [8], F32_TYPE, 64), tensor_info("b", [8], F32_TYPE, 0),
               tensor_info("c", [8], F32_TYPE, 32)]
    with GGUFFile(write(tmp_path, gguf_bytes([], tensors, f32_data(24)))) as f:
        assert f.tensor_data("c").view(np.float32).tolist() == list(range(8, 16))
        assert f.tensor_data("a").view(np.float32).tolist() == list(range(16, 24))


def test_bool_bytes_other_than_one_read_as_true(tmp_path):
    content = gguf_bytes([kv("k.b", BOOL, b"\x02"), kv("k.bs", ARR, array(BOOL, 3, b"\x00\x02\x01"))])
    with GGUFFile(write(tmp_path, content)) as f:
        assert f.get_bool("k.b") is True
        flags = f.get_array("k.bs")
        assert flags.dtype == np.bool_ and flags.tolist() == [False, True, True]
        assert not flags.flags.writeable
