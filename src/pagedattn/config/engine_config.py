"""EngineConfig: everything LLMEngine needs besides the model itself."""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from pagedattn.backend_spec import validate_backend
from pagedattn.config.cache_config import CacheConfig
from pagedattn.config.model_config import ACTIVATIONS
from pagedattn.config.scheduler_config import SchedulerConfig


@dataclass(frozen=True)
class EngineConfig:
    """Everything ``LLMEngine`` needs besides the model itself.

    Attributes:
        model: path of a GGUF file or safetensors folder; None = the embedded default model.
        cache: the KV cache configuration.
        scheduler: the batching configuration.
        seed: seed of the engine generator that unseeded requests draw their own seeds from.
        kv_store: the persistent KV tier: a directory, or ``redis://HOST:PORT/DB``; None = none.
        backend: array backend of the model and page pool: ``numpy`` (default), ``torch``
            (``cupy`` is refused by the engine: it serves KVStream and the kernels).
        device: ``cpu`` or ``cuda``; None = the backend's default (see
            :mod:`pagedattn.backends`).
        activations: ``float32`` (exact, the default) or ``int8`` (numpy backend: 4-bit
            projections on int8-quantized inputs, as llama.cpp; see
            :class:`pagedattn.model.llama.LlamaModel`).
        kv_store_key: shared secret (>= 16 bytes) that signs every record of the tier
            (HMAC-SHA256); records it did not sign are refused. None = unsigned records
            (kept out of ``repr``).
        kv_store_deadline_s: the most seconds a restore from the tier may take (> 0; the
            request waits for its KV meanwhile, no step does): pages not fetched by then are
            recomputed, and counted.

    Raises:
        ValueError: a negative seed, a cache/scheduler of the wrong type, an empty kv_store, a
            float16 KV cache on another backend than numpy;
            pagedattn.backends.BackendError (a ValueError): an unknown or invalid pair.
    """

    model: str | None = None
    cache: CacheConfig = CacheConfig()  # noqa: RUF009 (frozen: one shared default is safe)
    scheduler: SchedulerConfig = SchedulerConfig()  # noqa: RUF009 (frozen, as above)
    seed: int = 0
    kv_store: str | None = None
    backend: str = "numpy"
    device: str | None = None
    activations: str = "float32"
    kv_store_key: str | None = dataclass_field(default=None, repr=False)
    kv_store_deadline_s: float = 0.5

    def __post_init__(self) -> None:
        validate_backend(self.backend, self.device)
        if self.activations not in ACTIVATIONS:
            raise ValueError(
                f"EngineConfig.activations: expected one of {ACTIVATIONS}, got {self.activations!r}"
            )
        if not isinstance(self.cache, CacheConfig):
            raise ValueError(f"EngineConfig.cache: expected a CacheConfig, got {self.cache!r}")
        if not isinstance(self.scheduler, SchedulerConfig):
            raise ValueError(
                f"EngineConfig.scheduler: expected a SchedulerConfig, got {self.scheduler!r}"
            )
        if self.cache.kv_cache_dtype != "float32" and self.backend != "numpy":
            raise ValueError(
                f"CacheConfig.kv_cache_dtype {self.cache.kv_cache_dtype!r}: the numpy backend "
                f"only (got backend {self.backend!r})"
            )
        if self.scheduler.speculative is not None and (
            self.backend != "numpy" or self.cache.sliding_window is not None
        ):
            raise ValueError(
                "SchedulerConfig.speculative: needs the numpy backend (bitwise batch-invariant "
                f"decode rows) and no sliding_window; got backend {self.backend!r}, "
                f"sliding_window {self.cache.sliding_window!r}"
            )
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"EngineConfig.seed: expected an int >= 0, got {self.seed!r}")
        if self.kv_store is not None and (not isinstance(self.kv_store, str) or not self.kv_store):
            raise ValueError(
                "EngineConfig.kv_store: expected None, a directory or redis://HOST:PORT/DB, "
                f"got {self.kv_store!r}"
            )
        if self.kv_store_key is not None and not isinstance(self.kv_store_key, str):
            raise ValueError("EngineConfig.kv_store_key: expected None or a str")
        deadline = self.kv_store_deadline_s
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise ValueError(
                f"EngineConfig.kv_store_deadline_s: expected seconds, got {deadline!r}"
            )
        if not (math.isfinite(deadline) and deadline > 0):
            raise ValueError(f"EngineConfig.kv_store_deadline_s: expected > 0, got {deadline!r}")
