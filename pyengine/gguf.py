"""Validated, memory-mapped GGUF reading.

The header (metadata and tensor infos) is parsed here with `struct` and numpy
directly over a read-only mmap, so that every count read from the file is checked
against the bytes that remain *before* anything proportional to it is allocated or
looped over. `tensor_data` hands out read-only uint8 views: of the mmap, or on Linux
with transparent huge pages, of a copy of the tensor in 2 MiB pages (see
`_huge_pages_wanted`). The `gguf` package supplies constants only (type ids and block sizes).

Layout (little-endian, versions 2 and 3):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value type | value)
    n_tensors x (string name | u32 n_dims | n_dims x u64 ne | u32 ggml type | u64 offset)
    padding to `general.alignment` | tensor data (offsets relative to its start)
A string is a u64 byte length followed by UTF-8 bytes; an array is a u32 element
type, a u64 count, then the elements.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from pyengine import hugepages
from pyengine.errors import GGUFError, ModelNotFoundError

__all__ = ["GGUFFile", "TensorInfo", "MISSING", "DEFAULT_ALIGNMENT"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
# Element counts and byte sizes past this are corrupt, whatever the file claims.
MAX_SIZE = 2**62
# Arrays of arrays nest at most this deep; deeper is corrupt (and would recurse).
MAX_ARRAY_NESTING = 8


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: object = _Missing()
"""Default of the typed getters: a missing key raises instead of returning it."""

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")  # magic, version, n_tensors, n_kv
_DIMS = {n: struct.Struct(f"<{n}Q") for n in range(1, 5)}  # shape of a tensor info, by n_dims

_VT = GGUFValueType
_SCALAR_STRUCTS: dict[int, struct.Struct] = {
    _VT.UINT8: struct.Struct("<B"), _VT.INT8: struct.Struct("<b"),
    _VT.UINT16: struct.Struct("<H"), _VT.INT16: struct.Struct("<h"),
    _VT.UINT32: struct.Struct("<I"), _VT.INT32: struct.Struct("<i"),
    _VT.UINT64: struct.Struct("<Q"), _VT.INT64: struct.Struct("<q"),
    _VT.FLOAT32: struct.Struct("<f"), _VT.FLOAT64: struct.Struct("<d"),
    _VT.BOOL: struct.Struct("<B"),
}
_ARRAY_DTYPES: dict[int, np.dtype] = {
    _VT.UINT8: np.dtype("<u1"), _VT.INT8: np.dtype("<i1"),
    _VT.UINT16: np.dtype("<u2"), _VT.INT16: np.dtype("<i2"),
    _VT.UINT32: np.dtype("<u4"), _VT.INT32: np.dtype("<i4"),
    _VT.UINT64: np.dtype("<u8"), _VT.INT64: np.dtype("<i8"),
    _VT.FLOAT32: np.dtype("<f4"), _VT.FLOAT64: np.dtype("<f8"),
    _VT.BOOL: np.dtype("<u1"),
}
_VALID_VALUE_TYPES = {int(t) for t in GGUFValueType}

# Fewest bytes an entry can take; used to reject counts the file cannot hold.
_MIN_STRING = 8                       # u64 length, empty text
_MIN_ARRAY = 4 + 8                    # element type + count, no elements
_MIN_KV = _MIN_STRING + 4 + 1         # key + value type + 1-byte scalar
_MIN_TENSOR_INFO = _MIN_STRING + 4 + 8 + 4 + 8  # name + n_dims + one dim + type + offset

# GGML type id -> (elements per block, bytes per block).
_BLOCK_SIZES: dict[int, tuple[int, int]] = {int(t): s for t, s in GGML_QUANT_SIZES.items()}


def _type_name(type_id: int) -> str:
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"unknown({type_id})"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in the file and how it is stored."""

    name: str
    type: int               # GGML type id as stored (0=F32, 1=F16, 2=Q4_0, ... 30=BF16)
    shape: tuple[int, ...]  # GGUF order: shape[0] is ne0, the row length; 1..4 dims
    offset: int             # absolute byte offset of the data in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return _type_name(self.type)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


# ---------------------------------------------------------------------------
# Header parsing: a cursor that bounds-checks every read against the file size
# ---------------------------------------------------------------------------

class _Cursor:
    """Reads little-endian fields from a buffer; every read checks the bytes left."""

    def __init__(self, buf: mmap.mmap, size: int, path: str) -> None:
        self.buf = buf
        self.size = size
        self.path = path
        self.pos = 0

    def remaining(self) -> int:
        return self.size - self.pos

    def error(self, message: str) -> GGUFError:
        return GGUFError(f"{self.path}: {message}")

    def truncated(self, nbytes: int, what: str, at: int | None = None) -> GGUFError:
        at = self.pos if at is None else at
        return self.error(
            f"file is truncated: {what} at offset {at} needs {nbytes} bytes, "
            f"but the file ends at {self.size}")

    def need(self, nbytes: int, what: str) -> None:
        if nbytes > self.size - self.pos:
            raise self.truncated(nbytes, what)

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        self.need(fmt.size, what)
        values = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return values

    def u32(self, what: str) -> int:
        return self.unpack(_U32, what)[0]

    def u64(self, what: str) -> int:
        return self.unpack(_U64, what)[0]

    def raw_string(self, what: str) -> bytes:
        length = self.u64(f"length of {what}")
        self.need(length, f"{what} ({length} bytes)")
        start = self.pos
        self.pos += length
        return self.buf[start:self.pos]

    def name(self, what: str) -> str:
        """A key or tensor name: must be valid UTF-8."""
        at = self.pos
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(f"{what} at offset {at} is not valid UTF-8 ({exc.reason})") from None

    def check_count(self, count: int, min_item_bytes: int, what: str, at: int) -> None:
        """Rejects a count whose items cannot fit in what is left of the file."""
        if count * min_item_bytes > self.remaining():
            raise self.error(
                f"{what} at offset {at} claims {count} entries, which need at least "
                f"{count * min_item_bytes} bytes, but only {self.remaining()} bytes remain "
                f"(corrupt count or truncated file)")


def _decode_value_text(raw: bytes) -> str:
    # Values (unlike keys) are decoded leniently: a vocabulary may hold a token that
    # is not valid UTF-8 on its own; surrogateescape keeps its exact bytes
    # recoverable with s.encode("utf-8", "surrogateescape").
    return raw.decode("utf-8", "surrogateescape")


def _read_value(cur: _Cursor, value_type: int, what: str, depth: int = 0) -> object:
    if value_type == _VT.STRING:
        return _decode_value_text(cur.raw_string(what))
    if value_type == _VT.ARRAY:
        return _read_array(cur, what, depth + 1)
    scalar = _SCALAR_STRUCTS.get(value_type)
    if scalar is None:
        raise cur.error(f"{what} has unknown value type {value_type} (offset {cur.pos - 4})")
    (value,) = cur.unpack(scalar, what)
    if value_type == _VT.BOOL:
        return value != 0
    return value


def _read_array(cur: _Cursor, what: str, depth: int) -> object:
    if depth > MAX_ARRAY_NESTING:
        raise cur.error(f"{what} at offset {cur.pos} nests arrays deeper than {MAX_ARRAY_NESTING}")
    at = cur.pos
    elem_type = cur.u32(f"element type of {what}")
    count = cur.u64(f"length of {what}")
    if elem_type not in _VALID_VALUE_TYPES:
        raise cur.error(f"{what} at offset {at} has unknown element type {elem_type}")
    if elem_type == _VT.STRING:
        cur.check_count(count, _MIN_STRING, what, at)
        return _read_string_array(cur, count, what)
    if elem_type == _VT.ARRAY:
        cur.check_count(count, _MIN_ARRAY, what, at)
        return [_read_array(cur, f"{what}[{i}]", depth + 1) for i in range(count)]
    return _read_numeric_array(cur, elem_type, count, what, at)


def _read_numeric_array(cur: _Cursor, elem_type: int, count: int, what: str, at: int) -> np.ndarray:
    dtype = _ARRAY_DTYPES[elem_type]
    cur.check_count(count, dtype.itemsize, what, at)
    if count == 0:
        values = np.empty(0, dtype=dtype)
        values.flags.writeable = False
    else:
        # A zero-copy view; read-only because the mmap is ACCESS_READ.
        values = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=cur.pos)
    cur.pos += count * dtype.itemsize
    if elem_type == _VT.BOOL:
        if values.size and values.max() > 1:
            values = values != 0  # an unusual encoding of true: normalize (a small copy)
            values.flags.writeable = False
        else:
            values = values.view(np.bool_)
    return values


class StringArray(Sequence):
    """A GGUF array of strings, decoded on access from the mapped file.

    Vocabularies hold hundreds of thousands of strings; kept as Python str
    objects they would cost ~20 MB that the tokenizer already holds in its
    own form.  Lengths are validated when the file is opened; decoding
    (utf-8 with surrogateescape, as every GGUF text) cannot fail."""

    def __init__(self, buf, starts: np.ndarray, lengths: np.ndarray) -> None:
        self._buf, self._starts, self._lengths = buf, starts, lengths

    def __len__(self) -> int:
        return len(self._starts)

    def _decode(self, i: int) -> str:
        start = int(self._starts[i])
        return self._buf[start:start + int(self._lengths[i])].decode("utf-8", "surrogateescape")

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._decode(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("string array index out of range")
        return self._decode(index)

    def __iter__(self):
        return (self._decode(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (StringArray, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings)"


def _read_string_array(cur: _Cursor, count: int, what: str) -> StringArray:
    # The hot loop of header parsing (262k strings for Gemma 3): locals only.
    buf, size, pos = cur.buf, cur.size, cur.pos
    unpack_len = _U64.unpack_from
    starts = np.empty(count, np.int64)  # count was checked against the bytes left
    lengths = np.empty(count, np.int64)
    for i in range(count):
        if pos + 8 > size:
            raise cur.truncated(8, f"length of {what}[{i}]", at=pos)
        (length,) = unpack_len(buf, pos)
        pos += 8
        if length > size - pos:
            raise cur.truncated(length, f"{what}[{i}] ({length} bytes)", at=pos)
        starts[i] = pos
        lengths[i] = length
        pos += length
    cur.pos = pos
    return StringArray(buf, starts, lengths)


def _read_metadata(cur: _Cursor, n_kv: int) -> dict[str, object]:
    metadata: dict[str, object] = {}
    for index in range(n_kv):
        at = cur.pos
        key = cur.name(f"key of metadata entry #{index}")
        if key in metadata:
            raise cur.error(f"duplicate metadata key {key!r} (entry #{index} at offset {at})")
        value_type = cur.u32(f"value type of metadata key {key!r}")
        if value_type not in _VALID_VALUE_TYPES:
            raise cur.error(
                f"metadata key {key!r} (at offset {at}) has unknown value type {value_type}")
        metadata[key] = _read_value(cur, value_type, f"value of metadata key {key!r}")
    return metadata


def _alignment_from(cur: _Cursor, metadata: dict[str, object]) -> int:
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int):
        raise cur.error(f"general.alignment must be an integer, got {_kind(alignment)}")
    if alignment <= 0 or alignment & (alignment - 1):
        raise cur.error(f"general.alignment must be a positive power of two, got {alignment}")
    return alignment


class _RawTensorInfo:
    """A tensor info as read, before its offset is made absolute."""

    __slots__ = ("name", "type", "shape", "rel_offset", "nbytes", "at")

    def __init__(self, name: str, type_id: int, shape: tuple[int, ...], rel_offset: int,
                 nbytes: int, at: int) -> None:
        self.name, self.type, self.shape = name, type_id, shape
        self.rel_offset, self.nbytes, self.at = rel_offset, nbytes, at


def _tensor_nbytes(cur: _Cursor, where: str, type_id: int, shape: tuple[int, ...]) -> int:
    if any(dim < 1 for dim in shape):
        raise cur.error(f"{where} has a dimension < 1: shape {list(shape)}")
    n_elements = math.prod(shape)
    if n_elements > MAX_SIZE:
        raise cur.error(f"{where} has {n_elements} elements (shape {list(shape)}), past 2**62")
    block = _BLOCK_SIZES.get(type_id)
    if block is None:
        raise cur.error(f"{where} has unknown GGML type id {type_id}")
    block_elements, block_bytes = block
    if shape[0] % block_elements:
        raise cur.error(
            f"{where} has type {_type_name(type_id)} (blocks of {block_elements}) but its row "
            f"length ne0={shape[0]} is not a multiple of {block_elements}")
    nbytes = n_elements // block_elements * block_bytes
    if nbytes > MAX_SIZE:
        raise cur.error(f"{where} takes {nbytes} bytes (shape {list(shape)}), past 2**62")
    return nbytes


def _read_tensor_info(cur: _Cursor, index: int, alignment: int) -> _RawTensorInfo:
    at = cur.pos
    name = cur.name(f"name of tensor info #{index}")
    where = f"tensor {name!r} (tensor info #{index} at offset {at})"
    n_dims = cur.u32(f"n_dims of {where}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.error(f"{where} has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}")
    shape = cur.unpack(_DIMS[n_dims], f"shape of {where}")
    type_id = cur.u32(f"type of {where}")
    rel_offset = cur.u64(f"data offset of {where}")
    nbytes = _tensor_nbytes(cur, where, type_id, shape)
    if rel_offset % alignment:
        raise cur.error(
            f"{where} has data offset {rel_offset}, not a multiple of the alignment {alignment}")
    return _RawTensorInfo(name, type_id, shape, rel_offset, nbytes, at)


def _read_tensor_infos(cur: _Cursor, n_tensors: int, alignment: int) -> dict[str, TensorInfo]:
    raw_infos: dict[str, _RawTensorInfo] = {}
    for index in range(n_tensors):
        info = _read_tensor_info(cur, index, alignment)
        if info.name in raw_infos:
            raise cur.error(f"duplicate tensor name {info.name!r} (tensor info #{index} "
                            f"at offset {info.at})")
        raw_infos[info.name] = info
    data_offset = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for info in raw_infos.values():
        offset = data_offset + info.rel_offset
        end = offset + info.nbytes
        if end > cur.size:
            raise cur.error(
                f"file is truncated (or the tensor offset is corrupt): data of tensor "
                f"{info.name!r} spans bytes [{offset}, {end}) but the file ends at {cur.size}")
        tensors[info.name] = TensorInfo(info.name, info.type, info.shape, offset, info.nbytes)
    _refuse_overlaps(cur, tensors)
    return tensors


def _refuse_overlaps(cur: _Cursor, tensors: dict[str, TensorInfo]) -> None:
    """Two tensors sharing bytes would read each other's data (llama.cpp requires them
    laid out one after another); sorted by offset, each must end before the next starts."""
    by_offset = sorted(tensors.values(), key=lambda info: (info.offset, info.nbytes))
    for first, second in zip(by_offset, by_offset[1:]):
        first_end = first.offset + first.nbytes
        if first_end > second.offset:
            raise cur.error(
                f"the data of tensors {first.name!r} (bytes [{first.offset}, {first_end})) and "
                f"{second.name!r} (bytes [{second.offset}, {second.offset + second.nbytes})) overlap")


def _read_header(cur: _Cursor) -> tuple[int, int, int]:
    """Magic and version; returns (version, n_tensors, n_kv), counts checked."""
    cur.need(4, "magic")
    magic = cur.buf[0:4]
    if magic != GGUF_MAGIC:
        raise cur.error(f"not a GGUF file: magic {magic!r} at offset 0, expected {GGUF_MAGIC!r}")
    _, version, n_tensors, n_kv = cur.unpack(_HEADER, "GGUF header (magic, version, counts)")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in (1, 2, 3):
            raise cur.error("big-endian GGUF files are not supported; convert it to little-endian")
        if version == 1:
            raise cur.error("GGUF version 1 is obsolete and not supported; re-convert the model "
                            "(versions 2 and 3 are read)")
        raise cur.error(f"unsupported GGUF version {version} (versions 2 and 3 are read)")
    at = cur.pos
    needed = n_kv * _MIN_KV + n_tensors * _MIN_TENSOR_INFO
    if needed > cur.remaining():
        raise cur.error(
            f"header claims {n_tensors} tensors and {n_kv} metadata entries, which need at "
            f"least {needed} bytes after offset {at}, but only {cur.remaining()} bytes remain "
            f"(corrupt counts or truncated file)")
    return version, n_tensors, n_kv


# ---------------------------------------------------------------------------
# The public file object
# ---------------------------------------------------------------------------

def _kind(value: object) -> str:
    """How a metadata value reads in error messages."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, np.ndarray):
        return f"array of {value.dtype}"
    if isinstance(value, (list, StringArray)):
        return "array"
    return type(value).__name__


def _open_mmap(path: str) -> tuple[mmap.mmap | None, int]:
    """Maps the file read-only; returns (None, 0) for an empty file (mmap refuses those)."""
    if not os.path.exists(path):
        raise ModelNotFoundError(f"GGUF file not found: {path}")
    if os.path.isdir(path):
        raise GGUFError(f"{path} is a directory, not a GGUF file")
    try:
        # A FIFO or device would block or stream forever: only regular files are read.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise GGUFError(f"{path} is not a regular file, so it cannot be a GGUF file")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None, 0
            # The mmap keeps its own duplicate of the descriptor; ours closes here.
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size
    except OSError as exc:
        raise GGUFError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # mmap of a special file
        raise GGUFError(f"cannot map GGUF file {path}: {exc}") from None


# Decoding reads every weight once per token.  Through 4 KiB pages each 4 KiB of
# that stream costs a TLB miss: with the weights in 2 MiB pages a SmolLM2 decode
# step is ~10% faster (8% with 4 sequences).  So where Linux backs madvised memory
# with huge pages, the tensors are read (their file pages go to the page cache, not
# to this process) into private memory laid out as the file's data section, each on
# its first request; a lookup table (token embeddings: a few rows per token) stays a
# view of the mapping, and its part of that memory is never touched.  Getting huge
# pages from the kernel costs load time (~1 s per GiB on the VM this was measured
# on, against a mapping's near-instant start), so by default only tensor data up to
# _HUGE_DEFAULT_MAX is copied; PYENGINE_MMAP=0 copies any size, PYENGINE_MMAP=1
# none.  Never more than half the memory available: the mapping's pages the OS may
# drop under memory pressure (a model larger than memory still loads).
_HUGE_DEFAULT_MAX = 1 << 30


def _huge_pages_wanted(size: int) -> bool:
    choice = os.environ.get("PYENGINE_MMAP")
    if choice == "1" or size < hugepages.HUGE_PAGE:
        return False
    if choice != "0" and size > _HUGE_DEFAULT_MAX:
        return False
    return hugepages.available() and size <= hugepages.available_memory() // 2


# bytes of a tensor read and transformed at a time (GGUFFile.tensor_data's `unit`)
_TRANSFORM_PIECE = 4 << 20


def _read_into(path: str, offset: int, view: memoryview) -> None:
    """Fills `view` with the file's bytes from `offset`."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            done = 0
            while done < len(view):
                n = f.readinto(view[done:])
                if not n:   # the file shrank after it was parsed
                    raise GGUFError(f"{path}: file is truncated: tensor data ends at {offset + done}, "
                                    f"a tensor needs {offset + len(view)}")
                done += n
    except OSError as exc:
        raise GGUFError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from None


class GGUFFile:
    """A GGUF file, validated and memory-mapped; tensors stay in place in the mmap
    unless they are read into huge pages on first request (see _huge_pages_wanted)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path: str = os.fspath(path)
        mm, self.file_size = _open_mmap(self.path)
        self._mmap = mm
        self._arena: tuple[mmap.mmap, int] | None = None   # (buffer, shift from file offsets)
        self._arena_checked = False
        self._in_arena: set[str] = set()
        self._transformed: dict[str, np.ndarray] = {}
        try:
            self._parse(mm)
        except BaseException:
            self.close()
            raise

    def _parse(self, mm: mmap.mmap | None) -> None:
        cur = _Cursor(mm if mm is not None else b"", self.file_size, self.path)
        self.version, n_tensors, n_kv = _read_header(cur)
        self.metadata: dict[str, object] = _read_metadata(cur, n_kv)
        self.alignment: int = _alignment_from(cur, self.metadata)
        self.tensors: dict[str, TensorInfo] = _read_tensor_infos(cur, n_tensors, self.alignment)
        self.data_offset: int = -(-cur.pos // self.alignment) * self.alignment

    # -- metadata ------------------------------------------------------------

    @property
    def architecture(self) -> str:
        return self.get_str("general.architecture")

    def arch_key(self, name: str) -> str:
        return f"{self.architecture}.{name}"

    def _get(self, key: str, default: object) -> object:
        if key in self.metadata:
            return self.metadata[key]
        if default is MISSING:
            raise GGUFError(f"{self.path}: missing metadata key {key!r}")
        return default

    def _wrong_type(self, key: str, expected: str) -> GGUFError:
        actual = self.metadata[key]
        return GGUFError(f"{self.path}: metadata key {key!r} should be {expected}, "
                         f"but it is {_kind(actual)}")

    def get_str(self, key: str, default: object = MISSING) -> str:
        value = self._get(key, default)
        if key in self.metadata and not isinstance(value, str):
            raise self._wrong_type(key, "str")
        return value  # type: ignore[return-value]

    def get_int(self, key: str, default: object = MISSING) -> int:
        value = self._get(key, default)
        if key in self.metadata and (isinstance(value, bool) or not isinstance(value, int)):
            raise self._wrong_type(key, "int")
        return value  # type: ignore[return-value]

    def get_float(self, key: str, default: object = MISSING) -> float:
        value = self._get(key, default)
        if key not in self.metadata:
            return value  # type: ignore[return-value]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._wrong_type(key, "float")
        return float(value)

    def get_bool(self, key: str, default: object = MISSING) -> bool:
        value = self._get(key, default)
        if key in self.metadata and not isinstance(value, bool):
            raise self._wrong_type(key, "bool")
        return value  # type: ignore[return-value]

    def get_array(self, key: str, default: object = MISSING) -> Sequence | np.ndarray:
        value = self._get(key, default)
        if key in self.metadata and not isinstance(value, (list, StringArray, np.ndarray)):
            raise self._wrong_type(key, "array")
        return value  # type: ignore[return-value]

    # -- tensors -------------------------------------------------------------

    def tensor_data(self, name: str, lookup: bool = False,
                    transform: Callable[[np.ndarray, np.ndarray], None] | None = None,
                    unit: int = 0) -> np.ndarray:
        """The tensor's raw bytes, read-only uint8: a view over the mmap, or of its copy
        in huge pages.  A `lookup` table (rows read a few at a time) is not copied for
        itself; it reads the copy if the tensor was asked for otherwise before.
        With `transform(src, dst)`, the bytes are rewritten once into memory of their
        own (the huge-page copy's place, else a private buffer; the same result on
        every such request); asked for without it, the tensor then reads the mmap.
        A `unit` (bytes) says the transform may take any whole number of them at a time:
        the file is then read and rewritten a few MiB at a time instead of whole."""
        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.path}: missing tensor {name!r}")
        if self._mmap is None:
            raise GGUFError(f"{self.path}: file is closed; cannot read tensor {name!r}")
        if transform is not None:
            return self._transformed_data(name, info, transform, unit)
        arena = None if (lookup and name not in self._in_arena) or name in self._transformed else self._huge_pages()
        if arena is None:
            data = np.frombuffer(self._mmap, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        else:
            buf, shift = arena
            if name not in self._in_arena:
                with memoryview(buf) as whole, whole[info.offset + shift:info.offset + shift + info.nbytes] as view:
                    _read_into(self.path, info.offset, view)
                self._in_arena.add(name)
            data = np.frombuffer(buf, dtype=np.uint8, count=info.nbytes, offset=info.offset + shift)
        data.flags.writeable = False
        return data

    def _transformed_data(self, name: str, info: TensorInfo,
                          transform: Callable[[np.ndarray, np.ndarray], None], unit: int) -> np.ndarray:
        data = self._transformed.get(name)
        if data is not None:
            return data
        arena = None if name in self._in_arena else self._huge_pages()   # a plain copy there stays valid
        if arena is None:
            data = np.empty(info.nbytes, np.uint8)
        else:
            buf, shift = arena
            data = np.frombuffer(buf, dtype=np.uint8, count=info.nbytes, offset=info.offset + shift)
        # the file's bytes are read past the mapping, as copies are: none of its pages
        # become this process's; by pieces, so no copy of a big table lives beside it
        piece = max(unit, _TRANSFORM_PIECE // unit * unit) if unit > 0 else info.nbytes
        source = np.empty(min(piece, info.nbytes), np.uint8)
        for start in range(0, info.nbytes, piece):
            n = min(piece, info.nbytes - start)
            with memoryview(source) as view, view[:n] as part:
                _read_into(self.path, info.offset + start, part)
            transform(source[:n], data[start:start + n])
        data.flags.writeable = False
        self._transformed[name] = data
        return data

    def transformed(self, name: str) -> np.ndarray | None:
        """The bytes a transform rewrote for the tensor (tensor_data(transform=)), if any."""
        return self._transformed.get(name)

    @property
    def huge_pages(self) -> bool:
        """Whether tensors (other than lookup tables) come from huge pages."""
        return self._mmap is not None and self._huge_pages() is not None

    def _huge_pages(self) -> tuple[mmap.mmap, int] | None:
        if not self._arena_checked:
            self._arena_checked = True
            size = self.file_size - self.data_offset
            arena = hugepages.arena(size) if _huge_pages_wanted(size) else None
            self._arena = None if arena is None else (arena[0], arena[1] - self.data_offset)
        return self._arena

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        # Numpy views (tensor_data results, and the numeric arrays in `metadata`)
        # export the mmap's buffer, and mmap.close() refuses with BufferError while
        # any export is alive. We never invalidate those views (a read through an
        # unmapped view would crash the process); instead this object drops its
        # reference, and the mapping is unmapped when the last view is garbage
        # collected. With no views alive, it is unmapped right here.
        mm, self._mmap = self._mmap, None
        self._arena, self._arena_checked = None, True   # copies live on in the views made of them
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version={self.version}, tensors={len(self.tensors)}, "
                f"metadata={len(self.metadata)})")
