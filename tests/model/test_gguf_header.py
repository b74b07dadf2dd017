"""model/gguf_header.py against gguf.GGUFReader (the oracle) and on corrupt / hostile files."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

from pagedattn.model.gguf_header import GGUFFile, read_gguf
from pagedattn.model.gguf_types import GGML_TYPES, VALUE_TYPES

V = GGUFValueType

# every scalar value type, with a value at the edge of its range
SCALARS: list[tuple[str, Any, GGUFValueType]] = [
    ("t.uint8", 255, V.UINT8),
    ("t.int8", -128, V.INT8),
    ("t.uint16", 65535, V.UINT16),
    ("t.int16", -32768, V.INT16),
    ("t.uint32", 2**32 - 1, V.UINT32),
    ("t.int32", -(2**31), V.INT32),
    ("t.float32", 1e-5, V.FLOAT32),
    ("t.bool", True, V.BOOL),
    ("t.string", "héllo ▁ <|im_end|>\n", V.STRING),
    ("t.uint64", 2**64 - 1, V.UINT64),
    ("t.int64", -(2**63), V.INT64),
    ("t.float64", -1.0 / 3.0, V.FLOAT64),
]
ARRAYS: list[tuple[str, list[Any], GGUFValueType]] = [
    ("a.uint8", [0, 7, 255], V.UINT8),
    ("a.int8", [-1, 2], V.INT8),
    ("a.uint16", [1, 65535], V.UINT16),
    ("a.int16", [-5, 5], V.INT16),
    ("a.uint32", [3, 4, 2**32 - 1], V.UINT32),
    ("a.int32", [1, 3, 1, 4], V.INT32),
    ("a.float32", [0.5, -2.25, 1e-3], V.FLOAT32),
    ("a.bool", [True, False, True], V.BOOL),
    ("a.string", ["Ġthe", "", "Ċ", "日本", "a b"], V.STRING),
    ("a.uint64", [2**64 - 1, 0], V.UINT64),
    ("a.int64", [-(2**63), 9], V.INT64),
    ("a.float64", [1.5, -0.0], V.FLOAT64),
]


def _write_every_type(path: Path, alignment: int | None = None) -> Path:
    writer = GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, value, vtype in SCALARS:
        writer.add_key_value(key, value, vtype)
    for key, values, vtype in ARRAYS:
        writer.add_key_value(key, values, V.ARRAY, sub_type=vtype)
    writer.add_array("a.nested", [[1, 2], [3, 4, 5]])
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 8), dtype=np.float32))
    writer.add_tensor("f16", rng.standard_normal((2, 4)).astype(np.float16))
    writer.add_tensor("i32", np.arange(5, dtype=np.int32))
    q8 = rng.standard_normal((4, 64), dtype=np.float32)
    writer.add_tensor(
        "q8_0", quantize(q8, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0
    )
    q41 = rng.standard_normal((2, 3, 32), dtype=np.float32)
    writer.add_tensor(
        "q4_1", quantize(q41, GGMLQuantizationType.Q4_1), raw_dtype=GGMLQuantizationType.Q4_1
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, np.ndarray):
        return list(value.tolist())
    if isinstance(value, list) and value and isinstance(value[0], list | np.ndarray):
        return [x for item in value for x in _flatten(item)]
    return list(value)


def assert_equals_reader(ours: GGUFFile, path: Path) -> None:
    """Every metadata value, value type and tensor of ``ours`` equals GGUFReader's."""
    reader = GGUFReader(str(path), "r")
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(fields)
    for key, field in fields.items():
        value, expected = ours.metadata[key], field.contents()
        types = tuple(t.name for t in field.types)
        if types[:2] == ("ARRAY", "ARRAY"):  # GGUFReader flattens arrays of arrays
            assert _flatten(value) == expected, key
            assert ours.value_types[key][0] == "ARRAY" and ours.value_types[key][-1] == types[-1]
            continue
        if isinstance(value, np.ndarray):
            assert value.ndim == 1, key
            value = value.tolist()
        assert value == expected and type(value) is type(expected), key
        assert ours.value_types[key] == types, key
    assert ours.data_start == reader.data_offset and ours.alignment == reader.alignment
    assert [t.name for t in ours.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(ours.tensors, reader.tensors, strict=True):
        assert mine.type_name == theirs.tensor_type.name
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert (mine.n_elements, mine.n_bytes) == (theirs.n_elements, theirs.n_bytes)
        assert mine.data_offset == theirs.data_offset
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape
        assert np.array_equal(mine.data, theirs.data), mine.name
        assert not mine.data.flags.writeable


def test_type_tables_equal_the_gguf_package() -> None:
    assert {v.name: v.value for v in GGUFValueType} == VALUE_TYPES
    assert {name: (code, block, size) for name, (code, block, size) in GGML_TYPES.items()} == {
        q.name: (q.value, *GGML_QUANT_SIZES[q]) for q in GGMLQuantizationType
    }


@pytest.mark.parametrize("alignment", [None, 64, 1])
def test_every_value_type_equals_gguf_reader(tmp_path: Path, alignment: int | None) -> None:
    path = _write_every_type(tmp_path / "all.gguf", alignment)
    ours = read_gguf(path)
    assert_equals_reader(ours, path)
    assert [x.tolist() for x in ours.metadata["a.nested"]] == [[1, 2], [3, 4, 5]]
    assert ours.get("t.string") == "héllo ▁ <|im_end|>\n" and ours.get("absent", 7) == 7
    assert ours.metadata["a.bool"].dtype == np.bool_
    assert ours.version == 3


@pytest.mark.model
def test_embedded_model_equals_gguf_reader() -> None:
    from pagedattn.model.registry import embedded_model_path

    path = embedded_model_path()
    ours = read_gguf(path)
    assert_equals_reader(ours, path)
    assert len(ours.metadata["tokenizer.ggml.tokens"]) == 49152


def test_every_truncation_of_the_header_is_refused(tmp_path: Path) -> None:
    data = _write_every_type(tmp_path / "all.gguf").read_bytes()
    end = max(t.data_offset + t.n_bytes for t in read_gguf(tmp_path / "all.gguf").tensors)
    assert end <= len(data)  # the writer pads after the last tensor
    for cut in range(end):
        path = tmp_path / "cut.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"truncated GGUF|not a readable GGUF"):
            read_gguf(path)


def _header(
    kv: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0, version: int = 3
) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kv + tensors


def _string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _tensor(name: str, dims: list[int], ggml_type: int, offset: int) -> bytes:
    return (
        _string(name)
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<IQ", ggml_type, offset)
    )


def _nested(depth: int) -> bytes:
    inner = struct.pack("<IQ", 4, 0)  # an empty UINT32 array
    for _ in range(depth):
        inner = struct.pack("<IQ", 9, 1) + inner
    return inner


CORRUPT: dict[str, tuple[bytes, str]] = {
    "magic": (b"GGML" + bytes(40), "magic"),
    "version 1": (_header(b"", 0, version=1), "GGUF version 1"),
    "big-endian": (_header(b"", 0, version=3 << 24), "big-endian"),
    "huge kv count": (_header(b"", 2**63), "truncated"),
    "huge tensor count": (_header(b"", 0, n_tensors=2**40), "truncated"),
    "huge key length": (_header(struct.pack("<Q", 2**62) + bytes(16), 1), "truncated"),
    "huge array": (_header(_string("k") + struct.pack("<IIQ", 9, 4, 2**61), 1), "truncated"),
    "huge string array": (_header(_string("k") + struct.pack("<IIQ", 9, 8, 2**60), 1), "trunc"),
    "unknown value type": (_header(_string("k") + struct.pack("<I", 13) + bytes(8), 1), "type 13"),
    "deep nesting": (_header(_string("k") + struct.pack("<I", 9) + _nested(50), 1), "nested"),
    "non-utf8 key": (_header(_string(b"\xff\xfe") + struct.pack("<IB", 0, 1), 1), "not UTF-8"),
    "duplicate key": (_header((_string("k") + struct.pack("<IB", 0, 1)) * 2, 2), "duplicate key"),
    "alignment 3": (
        _header(_string("general.alignment") + struct.pack("<II", 4, 3), 1),
        "power of two",
    ),
    "alignment type": (
        _header(_string("general.alignment") + struct.pack("<IQ", 10, 32), 1),
        "must be a UINT32",
    ),
    "unknown tensor type": (_header(b"", 0, _tensor("w", [4], 99, 0), 1), "ggml type 99"),
    "five dims": (_header(b"", 0, _tensor("w", [1] * 5, 0, 0), 1), "5 dims"),
    "partial block": (_header(b"", 0, _tensor("w", [16, 2], 8, 0), 1), "multiple of 32"),
    "misaligned": (_header(b"", 0, _tensor("w", [4], 0, 4) + bytes(64), 1), "alignment 32"),
    "past the end": (_header(b"", 0, _tensor("w", [1024], 0, 0) + bytes(64), 1), "truncated"),
    "overlap": (
        _header(b"", 0, _tensor("a", [16], 0, 0) + _tensor("b", [16], 0, 32) + bytes(200), 2),
        "overlap",
    ),
    "duplicate tensor": (
        _header(b"", 0, _tensor("a", [8], 0, 0) + _tensor("a", [8], 0, 32) + bytes(200), 2),
        "duplicate tensor",
    ),
    "int64 overflow": (
        _header(b"", 0, _tensor("w", [2**40, 2**40], 0, 0) + bytes(64), 1),
        "fit in int64",
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_headers_are_refused_by_name(tmp_path: Path, case: str) -> None:
    data, message = CORRUPT[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=message):
        read_gguf(path)


def test_random_header_corruption_only_raises_value_error(tmp_path: Path) -> None:
    """Flipping random header bytes either still parses or raises ValueError (never another
    exception, a hang or an unbounded allocation: every count is checked against the size)."""
    good = _write_every_type(tmp_path / "all.gguf")
    data = good.read_bytes()
    header_end = read_gguf(good).data_start
    rng = random.Random(0)
    refused = 0
    for _ in range(300):
        bad = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            bad[rng.randrange(4, header_end)] = rng.randrange(256)
        path = tmp_path / "fuzz.gguf"
        path.write_bytes(bytes(bad))
        try:
            read_gguf(path)
        except ValueError:
            refused += 1
    assert refused > 0
