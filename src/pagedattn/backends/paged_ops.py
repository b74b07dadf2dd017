"""The paged-attention functions of a backend: :func:`paged_ops` gives ``write_kv`` /
``paged_attention_decode`` / ``paged_attention_prefill``, the Numba kernels of
:mod:`pagedattn.kernels` for ``numpy`` and the array-namespace kernels of
:mod:`pagedattn.backends.xp_kernels` for ``torch`` and ``cupy``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagedattn.backends import BackendSpec


@dataclass(frozen=True)
class PagedOps:
    """The three paged-attention functions of one backend (same signatures everywhere:
    :mod:`pagedattn.kernels.paged`)."""

    write_kv: Callable[..., None]
    paged_attention_decode: Callable[..., Any]
    paged_attention_prefill: Callable[..., Any]


def paged_ops(spec: BackendSpec) -> PagedOps:
    """``write_kv`` and the paged decode / prefill attention for ``spec``.

    ``numpy`` gets the Numba kernels of :mod:`pagedattn.kernels` (host arrays only); ``torch``
    and ``cupy`` get :mod:`pagedattn.backends.xp_kernels`, which run on the arrays' own device.
    """
    if spec.name == "numpy":
        from pagedattn import kernels

        return PagedOps(
            kernels.write_kv, kernels.paged_attention_decode, kernels.paged_attention_prefill
        )
    from pagedattn.backends import xp_kernels

    return PagedOps(
        xp_kernels.write_kv, xp_kernels.paged_attention_decode, xp_kernels.paged_attention_prefill
    )
