"""A model's fingerprint from its weights: the content digest that names its pages in the
prefix cache and the persistent tier when the caller gives none.

The digest (xxh3-128, several GB/s) covers the model config and every weight tensor the
architecture table loads, in the model's ``named_tensors()`` order: each named by its place in
the decoder (``embed``, ``lm_head`` unless tied, ``final_norm``, per layer one entry per role of
the family, :attr:`pagedattn.model.architecture.Architecture.layer_roles`: ``attn_norm``, ``q``,
``k``, ``v``, biases, q/k norms, ``o``, the output norms, ``mlp_norm``, ``gate``, ``up``,
``down``), its storage kind (a dtype, or a GGUF block type, hashed as the file's blocks) and
bytes. The list comes from the table, so a family's extra tensor cannot be left out; a model
whose layers do not hold exactly its family's roles is refused. The NumPy and the torch model
of the same float32 weights share a fingerprint; the same weights stored another way (GGUF
blocks vs dequantized floats, bfloat16) do not. It is computed once per model object.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import numpy as np
import xxhash

_CACHE: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def weights_fingerprint(model: Any) -> str | None:
    """``"weights-xxh3_128:<hex>"`` of ``model``'s config and weights, or None when the model
    does not list its tensors (no ``named_tensors()``; then the caller must name it).

    Raises:
        ValueError: a layer whose tensors are not exactly its family's roles.
    """
    try:
        cached = _CACHE.get(model)
    except TypeError:  # not weakly referenceable: computed every time
        cached = None
    if cached is not None:
        return cached
    fields = _named_tensors(model)
    if fields is None:
        return None
    h = xxhash.xxh3_128()
    h.update(repr(getattr(model, "config", None)).encode("utf-8"))
    for name, parts in fields:
        chunks = [_canonical(p) for p in parts]
        kinds = ",".join(sorted({kind for kind, _ in chunks}))
        nbytes = sum(len(data) for _, data in chunks)
        h.update(f"\n{name}:{kinds}:{nbytes}\n".encode())
        for _, data in chunks:
            h.update(data)
    digest = f"weights-xxh3_128:{h.hexdigest()}"
    with contextlib.suppress(TypeError):
        _CACHE[model] = digest
    return digest


def _named_tensors(model: Any) -> list[tuple[str, list[Any]]] | None:
    named = getattr(model, "named_tensors", None)
    if named is None:
        return None
    from pagedattn.model.architecture import architecture_of

    config = model.config
    out = [(name, _parts(t)) for name, t in named()]
    roles = set(architecture_of(config).layer_roles)
    for i in range(config.num_layers):
        got = {n.removeprefix(f"layers.{i}.") for n, _ in out if n.startswith(f"layers.{i}.")}
        if got != roles:
            raise ValueError(
                f"weights fingerprint: layer {i} holds {sorted(got)}, but the "
                f"{config.architecture} table loads {sorted(roles)}"
            )
    return out


def _parts(value: Any) -> list[Any]:
    return list(value) if isinstance(value, tuple | list) else [value]


def _canonical(tensor: Any) -> tuple[str, memoryview]:
    """(storage kind, bytes) of one weight tensor."""
    blocks, type_name = getattr(tensor, "blocks", None), getattr(tensor, "type_name", None)
    if isinstance(blocks, np.ndarray) and isinstance(type_name, str):  # GGUF block form
        return type_name, np.ascontiguousarray(blocks).data.cast("B")
    if isinstance(tensor, np.ndarray):
        arr = np.ascontiguousarray(tensor)
        return arr.dtype.str, arr.data.cast("B")
    if hasattr(tensor, "detach") and hasattr(tensor, "cpu"):  # a torch tensor, on any device
        t = tensor.detach()
        kind = str(t.dtype).removeprefix("torch.")
        host = t.float().cpu().contiguous().numpy()  # exact: float16/bfloat16 widen losslessly
        return {"float32": "<f4"}.get(kind, kind), np.ascontiguousarray(host).data.cast("B")
    raise TypeError(f"unknown weight type {type(tensor).__name__}")
