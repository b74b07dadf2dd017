"""GGUF type codes: metadata value types and ggml tensor types, as the spec and ggml.h list them.

Sources: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (``gguf_metadata_value_type``)
and ggml.h ``enum ggml_type`` with each type's block size and bytes per block. Written out here so
that reading a GGUF does not import the ``gguf`` package; the tests check both tables against
``gguf.constants``.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

# GGUF metadata value types (spec "gguf_metadata_value_type"): name -> code.
VALUE_TYPES = {
    "UINT8": 0, "INT8": 1, "UINT16": 2, "INT16": 3, "UINT32": 4, "INT32": 5, "FLOAT32": 6,
    "BOOL": 7, "STRING": 8, "ARRAY": 9, "UINT64": 10, "INT64": 11, "FLOAT64": 12,
}  # fmt: skip
VALUE_NAMES = {code: name for name, code in VALUE_TYPES.items()}
# scalar value type code -> little-endian numpy dtype (bool is one byte, 0 or 1)
SCALAR_DTYPES: dict[int, np.dtype[Any]] = {
    0: np.dtype("u1"), 1: np.dtype("i1"), 2: np.dtype("<u2"), 3: np.dtype("<i2"),
    4: np.dtype("<u4"), 5: np.dtype("<i4"), 6: np.dtype("<f4"), 7: np.dtype("u1"),
    10: np.dtype("<u8"), 11: np.dtype("<i8"), 12: np.dtype("<f8"),
}  # fmt: skip
SCALAR_STRUCTS = {
    code: struct.Struct("<" + fmt)
    for code, fmt in zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIifBQqd", strict=True)
}
STRING, ARRAY, BOOL = 8, 9, 7

# ggml tensor types (ggml.h ``enum ggml_type``): name -> (code, elements per block, bytes per block)
GGML_TYPES = {
    "F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q8_1": (9, 32, 40),
    "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "Q8_K": (15, 256, 292),
    "IQ2_XXS": (16, 256, 66), "IQ2_XS": (17, 256, 74), "IQ3_XXS": (18, 256, 98),
    "IQ1_S": (19, 256, 50), "IQ4_NL": (20, 32, 18), "IQ3_S": (21, 256, 110),
    "IQ2_S": (22, 256, 82), "IQ4_XS": (23, 256, 136), "I8": (24, 1, 1), "I16": (25, 1, 2),
    "I32": (26, 1, 4), "I64": (27, 1, 8), "F64": (28, 1, 8), "IQ1_M": (29, 256, 56),
    "BF16": (30, 1, 2), "TQ1_0": (34, 256, 54), "TQ2_0": (35, 256, 66), "MXFP4": (39, 32, 17),
    "NVFP4": (40, 64, 36), "Q1_0": (41, 128, 18),
}  # fmt: skip
GGML_BY_CODE = {code: (name, block, size) for name, (code, block, size) in GGML_TYPES.items()}
# element dtype of the types ``gguf.GGUFReader`` exposes element-wise (others: raw uint8 blocks)
ELEMENT_DTYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8"),
}  # fmt: skip
