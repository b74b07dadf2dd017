"""JSON bodies encoded in small pieces, so a reply of megabytes never holds the GIL for long.

``json.dumps`` encodes a whole document in one C call that keeps the GIL from start to end: for
a reply with the prompt logprobs of a long prompt (megabytes of JSON) that is hundreds of
milliseconds in which no other thread (the event loop answering ``/health``, the engine thread)
runs. :func:`json_bytes` gives the same bytes as Starlette's ``JSONResponse`` (compact, UTF-8,
no NaN) but walks large containers itself and hands the C encoder at most :data:`SLICE` items of
shallow data at a time; between pieces the interpreter can switch threads.
"""

from __future__ import annotations

import json
from itertools import islice
from typing import Any

from starlette.responses import Response

#: Most items of a container (or most small containers of a list) encoded in one C call.
SLICE = 64

_encode = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
).encode
_SCALARS = (str, int, float, bool, type(None))


def json_bytes(content: Any) -> bytes:
    """``content`` as Starlette's ``JSONResponse`` renders it, encoded piece by piece.

    Raises:
        ValueError: a NaN or infinite float (as ``JSONResponse``).
        TypeError: a value JSON cannot hold.
    """
    parts: list[str] = []
    _pieces(content, parts)
    return "".join(parts).encode("utf-8")


def json_response(content: Any, status_code: int = 200) -> Response:
    """A ``application/json`` response of ``content`` (see :func:`json_bytes`)."""
    return Response(json_bytes(content), status_code=status_code, media_type="application/json")


def _flat(value: Any) -> bool:
    """A scalar, or a container of at most SLICE scalars."""
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, dict):
        values: Any = value.values()
    elif isinstance(value, list | tuple):
        values = value
    else:
        return False
    return len(value) <= SLICE and all(isinstance(v, _SCALARS) for v in values)


def _small(value: Any) -> bool:
    """Cheap for one C call: a flat value, or at most SLICE flat values."""
    if _flat(value):
        return True
    if isinstance(value, dict):
        return len(value) <= SLICE and all(_flat(v) for v in value.values())
    if isinstance(value, list | tuple):
        return len(value) <= SLICE and all(_flat(v) for v in value)
    return False


def _pieces(value: Any, out: list[str]) -> None:
    if _small(value):
        out.append(_encode(value))
    elif isinstance(value, dict):
        out.append("{")
        items = iter(value.items())
        first = True
        while pairs := list(islice(items, SLICE)):
            for key, item in pairs:
                if not first:
                    out.append(",")
                first = False
                out.append(_encode({key: None})[1:-5])  # the key as JSON spells it, and ':'
                _pieces(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for start in range(0, len(value), SLICE):
            chunk = value[start : start + SLICE]
            if start:
                out.append(",")
            if all(_small(v) for v in chunk):
                out.append(_encode(list(chunk))[1:-1])
            else:
                for i, item in enumerate(chunk):
                    if i:
                        out.append(",")
                    _pieces(item, out)
        out.append("]")
    else:
        out.append(_encode(value))  # raises the encoder's TypeError
