"""The names of the array backends and their devices, and the check of a (backend, device) pair.

A leaf: it imports nothing of pagedattn and no array library, so configs can validate a pair
without loading one. :mod:`pagedattn.backends` resolves a pair against the installed libraries.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("numpy", "torch", "cupy")
DEVICES: dict[str, tuple[str, ...]] = {
    "numpy": ("cpu",),
    "torch": ("cpu", "cuda"),
    "cupy": ("cuda",),
}
DEFAULT_DEVICE = {"numpy": "cpu", "torch": "cpu", "cupy": "cuda"}


class BackendError(ValueError):
    """An unknown backend or device, an invalid pair, or a library / device that is missing.

    The message is one line naming what was asked and what to install or choose instead.
    """


@dataclass(frozen=True)
class BackendSpec:
    """A validated (backend, device) pair, e.g. ``BackendSpec("torch", "cuda")``."""

    name: str
    device: str

    def __str__(self) -> str:
        return f"{self.name}/{self.device}"


def validate_backend(name: str = "numpy", device: str | None = None) -> BackendSpec:
    """Check the names and the pair only (imports nothing).

    Args:
        name: one of :data:`BACKENDS`.
        device: one of ``DEVICES[name]``; None picks ``DEFAULT_DEVICE[name]``.

    Raises:
        BackendError: an unknown backend or device, or a pair that does not exist
            (``numpy`` + ``cuda``, ``cupy`` + ``cpu``).
    """
    if name not in BACKENDS:
        raise BackendError(f"backend {name!r} is unknown; choose one of {', '.join(BACKENDS)}")
    device = DEFAULT_DEVICE[name] if device is None else device
    if device not in ("cpu", "cuda"):
        raise BackendError(f"device {device!r} is unknown; choose cpu or cuda")
    if device not in DEVICES[name]:
        hint = {"cuda": "use --backend torch or cupy for cuda", "cpu": "use numpy or torch on cpu"}
        raise BackendError(f"backend {name!r} does not run on device {device!r} ({hint[device]})")
    return BackendSpec(name, device)
