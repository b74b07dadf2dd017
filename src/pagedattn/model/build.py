"""Which model class runs a (backend, device) pair, and the engine's check that model and pool
agree.

| backend | model |
|---|---|
| ``numpy`` / ``cpu`` | :class:`pagedattn.model.decoder.DecoderModel` (GGUF blocks, Numba) |
| ``torch`` / ``cpu``, ``cuda`` | :class:`pagedattn.model.torch_model.TorchLlamaModel` |
| ``cupy`` / ``cuda`` | none: CuPy serves ``KVStream`` and the kernels; refused here |
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagedattn.backends import BackendError, BackendSpec, resolve_backend, validate_backend

if TYPE_CHECKING:
    from pagedattn.model.loader import LoadedModel

NUMPY = BackendSpec("numpy", "cpu")
CUPY_MODEL = (
    "backend 'cupy' serves KVStream and the kernels, not the whole model; "
    "run the model with --backend torch --device cuda"
)


def resolve_model_backend(name: str = "numpy", device: str | None = None) -> BackendSpec:
    """The validated pair a model (and its page pool) runs on.

    Raises:
        BackendError: as :func:`pagedattn.backends.resolve_backend`, or ``cupy`` (one line
            pointing to torch on cuda).
    """
    spec = validate_backend(name, device)
    if spec.name == "cupy":
        raise BackendError(CUPY_MODEL)
    return resolve_backend(spec.name, spec.device)


def model_backend(model: Any) -> BackendSpec:
    """The pair ``model`` runs on: its ``backend`` attribute, NumPy on the host without one."""
    spec = getattr(model, "backend", None)
    return spec if isinstance(spec, BackendSpec) else NUMPY


def build_model(
    loaded: LoadedModel, spec: BackendSpec, dtype: str = "float32", activations: str = "float32"
) -> Any:
    """The model of ``loaded`` for ``spec``.

    Args:
        loaded: a :func:`pagedattn.model.loader.load_model` result.
        spec: from :func:`resolve_model_backend`.
        dtype: torch weight / activation dtype (``float32``, ``float16``, ``bfloat16``); the
            NumPy backend computes in float32 only.
        activations: ``float32`` or ``int8`` (numpy only: see
            :class:`pagedattn.model.decoder.DecoderModel`).

    Raises:
        BackendError: cupy; ValueError: a dtype other than float32 on numpy, int8
            activations on another backend (or without AVX2).
    """
    if spec.name == "numpy":
        if dtype != "float32":
            raise ValueError(f"dtype: backend numpy computes in float32, got {dtype!r}")
        from pagedattn.model.decoder import DecoderModel

        return DecoderModel.from_loaded(loaded, activations)
    if activations != "float32":
        raise ValueError(
            f"activations: {activations} runs on the numpy backend only (got {spec.name})"
        )
    if spec.name == "torch":
        from pagedattn.model.torch_model import TorchLlamaModel

        return TorchLlamaModel.from_loaded(loaded, device=spec.device, dtype=dtype)
    raise BackendError(CUPY_MODEL)
