"""Arrays across the host / backend boundary.

Only small things cross (token ids, page tables, context lengths, one token's q/k/v in
:class:`pagedattn.stream.kv_stream.KVStream`, pages saved to or loaded from a storage tier); the
page pool and the attention state stay on the backend's device.

* :func:`to_backend` moves a host NumPy array onto a backend (a view for NumPy, a copy onto
  the device for torch CUDA and CuPy);
* :func:`to_host` brings any NumPy / torch / CuPy array back as NumPy;
* :func:`host_ints` and :func:`backend_array` check what crosses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.backends import BackendError, BackendSpec, array_module

try:
    from array_api_compat import is_array_api_obj, is_cupy_array, is_numpy_array, is_torch_array
except ImportError as e:  # the torch / cupy extras install it; numpy never imports this module
    raise BackendError(
        "the torch and cupy backends need array-api-compat: pip install 'array-api-compat>=1.9'"
    ) from e


def to_backend(a: Any, spec: BackendSpec) -> Any:
    """``a`` as an array of ``spec``'s library on its device.

    Args:
        a: a host NumPy array, or already an array of ``spec``'s library (returned as is when
            it is on the right device, else moved there).
        spec: the backend.

    Returns:
        A NumPy array (``numpy``), a ``torch.Tensor`` on ``spec.device`` (``torch``) or a
        ``cupy.ndarray`` on the current CUDA device (``cupy``); same dtype and shape.

    Raises:
        ValueError: ``a`` is not an array, or an array of a third library.
        pagedattn.backends.BackendError: the backend's library is not installed.
    """
    if spec.name == "numpy":
        return to_host(a)
    xp = array_module(spec)
    if spec.name == "torch":
        if is_torch_array(a):
            return a.to(spec.device)
        host = np.ascontiguousarray(to_host(a))
        if not host.flags.writeable:  # torch must not alias a read-only buffer
            host = host.copy()
        return xp.from_numpy(host).to(spec.device)
    if is_cupy_array(a):
        return a
    return xp.asarray(to_host(a))  # CuPy: host to the current device


def to_host(a: Any) -> np.ndarray:
    """A host NumPy array with the values of ``a`` (NumPy: ``a`` itself; no copy when possible).

    Raises:
        ValueError: ``a`` is neither a NumPy, a torch nor a CuPy array.
    """
    if is_numpy_array(a):
        return np.asarray(a)
    if is_torch_array(a):
        return np.asarray(a.detach().cpu().numpy())
    if is_cupy_array(a):
        return np.asarray(a.get())  # device to host
    raise ValueError(f"expected a NumPy, torch or CuPy array, got {type(a).__name__}")


def host_ints(a: Any) -> Any:
    """An integer table (page tables, context lengths, slots) as a host NumPy array.

    A NumPy array, or anything that is not an array (a list), passes through unchanged so
    that the kernels' checks report it; torch and CuPy arrays are copied to the host.
    """
    if is_array_api_obj(a) and not is_numpy_array(a):
        return to_host(a)
    return a


def backend_array(name: str, a: Any, spec: BackendSpec, shape: tuple[int, ...], names: str) -> Any:
    """Argument ``name`` as a float32 array of ``spec`` with shape ``shape``.

    Args:
        name: the argument's name, for the message.
        a: a host NumPy array or an array of ``spec``'s library (moved to its device).
        names: the shape in words, e.g. ``"(num_heads, head_dim)"``.

    Raises:
        ValueError: ``a`` is not an array, not float32, or of another shape (the message
            names the argument and the expected shape).
    """
    if not (is_numpy_array(a) or is_torch_array(a) or is_cupy_array(a)):
        raise ValueError(
            f"{name}: expected a float32 array {names} = {shape}, got {type(a).__name__}"
        )
    out = to_backend(a, spec)
    if out.dtype != array_module(spec).float32 or tuple(out.shape) != shape:
        raise ValueError(
            f"{name}: expected float32 {names} = {shape}, got {out.dtype} {tuple(out.shape)}"
        )
    return out
