"""Read a GGUF file's header (metadata key/values and tensor infos) straight from the bytes.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (versions 2 and 3,
little-endian): magic ``GGUF``, uint32 version, uint64 tensor count, uint64 key/value count,
the key/values (string key, uint32 value type, value), the tensor infos (string name, uint32
n_dims, n_dims x uint64 dims fastest-first, uint32 ggml type, uint64 offset into the data
section), padding to ``general.alignment`` (default 32), then the tensor data.

``gguf.GGUFReader`` builds one numpy memmap view per string of the 49k-token vocabulary, which
takes seconds; here scalars are read with :mod:`struct`, numeric arrays with one
``np.frombuffer`` each, string arrays with one tight loop over the bytes, and tensor data are
views of one read-only ``mmap`` of the file (nothing is copied or dequantized). Everything is
validated against the file's size before it is used, so a corrupt or hostile file raises
:class:`ValueError` naming what is wrong instead of allocating without bound or reading past
the end. The ``gguf`` package is not imported (its import alone costs tens of milliseconds);
the type tables (:mod:`.gguf_types`) are the spec's, checked against ``gguf.constants``.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.model.gguf_types import (
    ARRAY,
    BOOL,
    ELEMENT_DTYPES,
    GGML_BY_CODE,
    GGML_TYPES,
    SCALAR_DTYPES,
    SCALAR_STRUCTS,
    STRING,
    VALUE_NAMES,
)

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8

_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of a GGUF file.

    Attributes:
        name: tensor name (``blk.0.attn_q.weight``).
        type_name: ggml type (``"F32"``, ``"Q4_1"``...; keys of :data:`GGML_TYPES`).
        shape: dims as the file lists them, fastest-varying first (ggml ``ne``).
        n_elements: product of ``shape``.
        n_bytes: bytes of data (``n_elements / block size * bytes per block``).
        data_offset: absolute byte offset of the data in the file.
        data: read-only view of the memory-mapped file, laid out as ``gguf.GGUFReader`` lays it
            out: element-typed (float32, float16, ints) with numpy shape ``shape[::-1]`` for
            F32 / F16 / F64 / I8-I64, else uint8 of shape ``shape[::-1][:-1] + (bytes per
            row,)``.
    """

    name: str
    type_name: str
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF file: metadata values, their types, and tensor infos with data views.

    Attributes:
        path: the file.
        version: GGUF version (2 or 3).
        metadata: key -> value in file order. Scalars are Python ``int`` / ``float`` / ``bool``,
            strings ``str``, numeric arrays 1-D numpy arrays (little-endian dtype of the value
            type, bool arrays ``bool``), string arrays ``list[str]``, arrays of arrays lists.
        value_types: key -> type names, e.g. ``("UINT32",)`` or ``("ARRAY", "STRING")`` (an
            array's element type follows it, as ``gguf.ReaderField.types``).
        tensors: tensor infos in file order.
        alignment: data alignment in bytes (``general.alignment``, default 32).
        data_start: absolute offset of the data section.
    """

    path: Path
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, tuple[str, ...]]
    tensors: list[GGUFTensorInfo]
    alignment: int
    data_start: int

    def get(self, key: str, default: Any = None) -> Any:
        """The metadata value of ``key``, or ``default`` when absent."""
        return self.metadata.get(key, default)


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; errors name the file and offset."""

    def __init__(self, buf: Any, size: int, path: Path) -> None:
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: corrupt GGUF at byte {self.pos}: {what}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise ValueError(
                f"{self.path}: truncated GGUF at byte {self.pos}: {what} needs {n} bytes, "
                f"{self.size - self.pos} left in the file"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(value)

    def string(self, what: str) -> str:
        n = self.u64(f"{what} length")
        self.need(n, what)
        start, self.pos = self.pos, self.pos + n
        try:
            return str(self.buf[start : self.pos], "utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.path}: {what} at byte {start} is not UTF-8 ({exc})") from None

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` strings in a row; one tight loop (the vocabulary's 49k tokens)."""
        self.need(8 * count, what)  # each string is at least its length field
        buf, pos, end, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out: list[str] = [""] * count
        try:
            for i in range(count):
                if pos + 8 > end:
                    break
                start = pos + 8
                pos = start + unpack(buf, pos)[0]
                if pos > end:
                    break
                out[i] = str(buf[start:pos], "utf-8")
            else:
                self.pos = pos
                return out
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.path}: {what}: element {i} is not UTF-8 ({exc})") from None
        self.pos = min(pos, end)
        raise ValueError(
            f"{self.path}: truncated GGUF: {what}: element {i} of {count} runs past the end"
        )

    def value(self, code: int, what: str, depth: int = 0) -> tuple[Any, tuple[str, ...]]:
        """One value of type ``code`` and its type names."""
        if code == STRING:
            return self.string(what), ("STRING",)
        if code in SCALAR_STRUCTS:
            dtype = SCALAR_DTYPES[code]
            self.need(dtype.itemsize, what)
            (raw,) = SCALAR_STRUCTS[code].unpack_from(self.buf, self.pos)
            self.pos += dtype.itemsize
            return (bool(raw) if code == BOOL else raw), (VALUE_NAMES[code],)
        if code != ARRAY:
            raise self.fail(f"{what}: unknown value type {code}")
        if depth >= MAX_ARRAY_NESTING:
            raise self.fail(f"{what}: arrays nested deeper than {MAX_ARRAY_NESTING}")
        sub = self.u32(f"{what} element type")
        count = self.u64(f"{what} length")
        if sub in SCALAR_DTYPES:
            dtype = SCALAR_DTYPES[sub]
            self.need(count * dtype.itemsize, f"{what} ({count} x {VALUE_NAMES[sub]})")
            values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += count * dtype.itemsize
            return (values != 0 if sub == BOOL else values), ("ARRAY", VALUE_NAMES[sub])
        if sub == STRING:
            return self.strings(count, what), ("ARRAY", "STRING")
        if sub != ARRAY:
            raise self.fail(f"{what}: unknown array element type {sub}")
        self.need(12 * count, what)  # each inner array is at least its type and length
        items: list[Any] = []
        types: tuple[str, ...] = ("ARRAY", "ARRAY")
        for i in range(count):
            item, types = self.value(ARRAY, f"{what}[{i}]", depth + 1)
            items.append(item)
        return items, ("ARRAY", *types)


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF file's header and map its tensor data read-only (no data is read).

    Args:
        path: a GGUF file (version 2 or 3, little-endian).

    Returns:
        A :class:`GGUFFile`; its tensors' ``data`` view the memory-mapped file.

    Raises:
        ValueError: not a GGUF (magic), an unsupported version or a big-endian file, a count,
            length or offset that does not fit in the file, an unknown value or tensor type,
            a duplicate key or tensor name, a non-UTF-8 string, a bad ``general.alignment``,
            more than 4 dims, a row length not a multiple of its type's block, a misaligned,
            out-of-file or overlapping tensor. The message names the file and the field.
    """
    path = Path(path)
    with path.open("rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise ValueError(f"{path}: not a readable GGUF file ({size} bytes, a header is 24)")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(mapped, size, path)
    if mapped[:4] != GGUF_MAGIC:
        raise ValueError(
            f"{path}: not a readable GGUF file (magic {bytes(mapped[:4])!r}, expected b'GGUF')"
        )
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        swapped = version & 0xFFFF == 0
        raise ValueError(
            f"{path}: "
            + ("big-endian GGUF files are not supported" if swapped else f"GGUF version {version}")
            + f" (supported: little-endian versions {list(SUPPORTED_VERSIONS)})"
        )
    n_tensors, n_kv = cur.u64("tensor count"), cur.u64("key/value count")
    cur.need(13 * n_kv + 24 * n_tensors, f"{n_kv} key/values and {n_tensors} tensor infos")
    metadata: dict[str, Any] = {}
    value_types: dict[str, tuple[str, ...]] = {}
    for i in range(n_kv):
        key = cur.string(f"key {i}")
        if key in metadata:
            raise cur.fail(f"duplicate key {key!r}")
        metadata[key], value_types[key] = cur.value(cur.u32(f"type of {key!r}"), repr(key))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in metadata and value_types["general.alignment"] != ("UINT32",):
        raise ValueError(f"{path}: general.alignment must be a UINT32")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"{path}: general.alignment {alignment} is not a power of two")
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_start = -(-cur.pos // alignment) * alignment
    whole = np.frombuffer(mapped, dtype=np.uint8)
    tensors = _tensors(path, infos, whole, data_start, alignment)
    return GGUFFile(path, version, metadata, value_types, tensors, int(alignment), data_start)


def _tensor_info(cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], str, int]:
    name = cur.string(f"tensor {i} name")
    n_dims = cur.u32(f"tensor {name!r} n_dims")
    if n_dims > MAX_DIMS:
        raise cur.fail(f"tensor {name!r} has {n_dims} dims (at most {MAX_DIMS})")
    shape = tuple(cur.u64(f"tensor {name!r} dim") for _ in range(n_dims))
    code = cur.u32(f"tensor {name!r} type")
    if code not in GGML_BY_CODE:
        raise cur.fail(f"tensor {name!r} has unknown ggml type {code}")
    return name, shape, GGML_BY_CODE[code][0], cur.u64(f"tensor {name!r} offset")


def _tensors(
    path: Path,
    infos: list[tuple[str, tuple[int, ...], str, int]],
    whole: np.ndarray,
    data_start: int,
    alignment: int,
) -> list[GGUFTensorInfo]:
    tensors: list[GGUFTensorInfo] = []
    names: set[str] = set()
    for name, shape, type_name, offset in infos:
        if name in names:
            raise ValueError(f"{path}: duplicate tensor name {name!r}")
        names.add(name)
        _, block, type_size = GGML_TYPES[type_name]
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        if n_elements > _INT64_MAX or (shape and shape[0] % block):
            raise ValueError(
                f"{path}: tensor {name!r} of shape {list(shape)} and type {type_name}: "
                f"the first dim must be a multiple of {block} and the size fit in int64"
            )
        n_bytes = n_elements // block * type_size
        start = data_start + offset
        if offset % alignment:
            raise ValueError(
                f"{path}: tensor {name!r}: data offset {offset} is not a multiple of the "
                f"alignment {alignment}"
            )
        if start + n_bytes > whole.size:
            raise ValueError(
                f"{path}: truncated GGUF: tensor {name!r} needs bytes up to {start + n_bytes}, "
                f"file has {whole.size}"
            )
        dims = shape[::-1]
        dtype = ELEMENT_DTYPES.get(type_name)
        raw = whole[start : start + n_bytes]
        if dtype is not None:
            data = raw.view(dtype).reshape(dims)
        else:
            data = raw.reshape(*dims[:-1], dims[-1] // block * type_size) if dims else raw
        tensors.append(GGUFTensorInfo(name, type_name, shape, n_elements, n_bytes, start, data))
    spans = sorted((t.data_offset, t.data_offset + t.n_bytes, t.name) for t in tensors)
    for (_, end, first), (start, _, second) in pairwise(spans):
        if start < end:
            raise ValueError(f"{path}: tensors {first!r} and {second!r} overlap in the file")
    return tensors
