"""Prefix hashing: chained page digests over exact token ids and a cache namespace.

A full page's hash is ``xxh3_128(namespace || parent_hash || token_ids)`` where ``token_ids`` are
encoded as little-endian int64 and ``parent_hash`` is the previous page's hash (a fixed root
marker for page 0). The chain makes a page's hash identify the whole prefix up to and including
that page, as in vLLM v1's automatic prefix caching (``kv_cache_utils.hash_block_tokens``,
https://docs.vllm.ai/en/latest/design/prefix_caching.html). The digest is stable across
processes and machines (never Python's salted ``hash()``), so it can also key a persistent
storage tier. The hash only *finds* a candidate page: the allocator compares the stored token
ids on every hit, so a digest collision can never serve another prefix's KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

#: Version of the KV layout and of this hashing scheme; bump it to orphan every stored page.
LAYOUT_VERSION = 1

#: Bytes in one page hash (xxh3_128 digest).
HASH_NBYTES = 16

#: Stand-in parent of the first page of every sequence (no page hash is this value by design:
#: real hashes are digests and this marker is one byte longer).
_ROOT_PARENT = b"\x00" * (HASH_NBYTES + 1)

PageHash = bytes


@dataclass(frozen=True)
class PageKey:
    """What names one full page: its chained hash, its parent's and its exact token ids.

    Attributes:
        page_hash: 16-byte prefix hash of the page.
        parent_hash: the previous page's hash, None for the first page of a sequence.
        token_ids: the page's token ids (page_size ints; fewer only in a stream file's
            partial last page).
    """

    page_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]


def _digest(data: bytes) -> bytes:
    """xxh3_128 digest of ``data`` (16 bytes). Tests monkeypatch this to force collisions."""
    return xxhash.xxh3_128_digest(data)


def _encode_tokens(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """Canonical encoding: little-endian int64, one per token id."""
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise ValueError(f"token_ids: expected a 1-D sequence, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"token_ids: expected integers, got dtype {arr.dtype}")
    return arr.astype("<i8", copy=False).tobytes()


def hash_page_tokens(
    parent_hash: PageHash | None, token_ids: Sequence[int] | np.ndarray, namespace: bytes
) -> PageHash:
    """Hash one full page chained to its parent.

    Args:
        parent_hash: the previous page's hash (16 bytes), or None for the first page.
        token_ids: (page_size,) exact token ids of the page, any integer type (encoded as
            little-endian int64).
        namespace: cache namespace bytes from :func:`cache_namespace`.

    Returns:
        16-byte xxh3_128 digest.

    Raises:
        ValueError: ``parent_hash`` is not 16 bytes, or ``token_ids`` is not 1-D integers.
    """
    if parent_hash is not None and len(parent_hash) != HASH_NBYTES:
        raise ValueError(f"parent_hash: expected {HASH_NBYTES} bytes, got {len(parent_hash)}")
    parent = _ROOT_PARENT if parent_hash is None else parent_hash
    ns_len = len(namespace).to_bytes(4, "little")
    return _digest(ns_len + namespace + parent + _encode_tokens(token_ids))


def prefix_page_hashes(
    token_ids: Sequence[int] | np.ndarray, page_size: int, namespace: bytes
) -> list[PageHash]:
    """Chained hashes of every *full* page of ``token_ids`` (a trailing partial page is skipped).

    Args:
        token_ids: (num_tokens,) token ids in position order.
        page_size: tokens per page (> 0).
        namespace: cache namespace bytes.

    Returns:
        ``num_tokens // page_size`` hashes; entry i identifies tokens ``[0, (i + 1) * page_size)``.

    Raises:
        ValueError: ``page_size`` < 1 or bad ``token_ids``.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    arr = np.asarray(token_ids)
    hashes: list[PageHash] = []
    parent: PageHash | None = None
    for i in range(len(arr) // page_size):
        parent = hash_page_tokens(parent, arr[i * page_size : (i + 1) * page_size], namespace)
        hashes.append(parent)
    return hashes


def cache_namespace(
    *,
    model_fingerprint: str,
    dtype: str,
    page_size: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    rope_theta: float,
    rope_scaling: str = "",
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
    position_mode: str = "absolute",
    activations: str = "float32",
    backend: str = "numpy",
    device: str = "cpu",
    layout_version: int = LAYOUT_VERSION,
) -> bytes:
    """Namespace bytes that make page hashes specific to everything that shapes a page's KV.

    Two caches share pages only when every field matches: the model (fingerprint of its
    weights' content), storage dtype, page geometry, RoPE parameters, the attention pattern the
    KV was computed under (window, sinks, position mode: with a window the KV of deeper layers
    differs from full attention), the activations mode and the layout version.

    The engine leaves ``backend`` and ``device`` at their defaults on purpose: pages computed
    by the NumPy and the torch backend, on a CPU or a GPU, or on hosts with other instruction
    sets, share one namespace (a tier shared by such servers serves each the others' pages).
    Their float32 KV agrees to rounding, not bit for bit: attention on another ISA or backend
    differs by about 1e-7 (summation order, FMA), so a restored page may carry those last bits.

    Args:
        model_fingerprint: stable id of the weights (e.g. a digest of the model file).
        dtype: KV storage dtype name, e.g. ``"float32"``.
        page_size, num_layers, num_kv_heads, head_dim: positive ints.
        rope_theta: RoPE base (> 0).
        rope_scaling: canonical text of any RoPE scaling config ("" for none).
        sliding_window: W or None; num_sink_tokens: S >= 0.
        position_mode: ``"absolute"`` or ``"shifted"``.
        activations: how the projections meet 4-bit weights (``"float32"`` exact, ``"int8"``
            llama.cpp-style): int8 KV is ~1% off the exact KV, so the two never share pages.
            (``float32`` adds no field, so existing namespaces are unchanged.)
        backend, device: a compute backend and device to keep apart (e.g. ``"torch"``,
            ``"cuda"``) for a caller that wants bit-identical pages only; the engine passes
            neither (see above).
        layout_version: see :data:`LAYOUT_VERSION`.

    Returns:
        16-byte digest of a canonical ``key=value`` text of the fields.

    Raises:
        ValueError: a non-positive size, a bad dtype, window, sink count or position mode.
    """
    for name, value in (
        ("page_size", page_size),
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"cache_namespace: {name} must be a positive int, got {value!r}")
    try:
        dtype_name = np.dtype(dtype).name
    except TypeError as exc:
        raise ValueError(f"cache_namespace: unknown dtype {dtype!r}") from exc
    if rope_theta <= 0:
        raise ValueError(f"cache_namespace: rope_theta must be > 0, got {rope_theta}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"cache_namespace: sliding_window must be >= 1, got {sliding_window}")
    if num_sink_tokens < 0:
        raise ValueError(f"cache_namespace: num_sink_tokens must be >= 0, got {num_sink_tokens}")
    if position_mode not in ("absolute", "shifted"):
        raise ValueError(
            f"cache_namespace: position_mode must be 'absolute' or 'shifted', got {position_mode!r}"
        )
    fields: tuple[str, ...] = (
        f"layout_version={layout_version}",
        f"model={model_fingerprint}",
        f"dtype={dtype_name}",
        f"page_size={page_size}",
        f"num_layers={num_layers}",
        f"num_kv_heads={num_kv_heads}",
        f"head_dim={head_dim}",
        f"rope_theta={float(rope_theta)!r}",
        f"rope_scaling={rope_scaling}",
        f"sliding_window={sliding_window}",
        f"num_sink_tokens={num_sink_tokens}",
        f"position_mode={position_mode}",
        f"backend={backend}",
        f"device={device}",
    )
    if activations != "float32":
        fields += (f"activations={activations}",)
    return xxhash.xxh3_128_digest("\n".join(fields).encode("utf-8"))
