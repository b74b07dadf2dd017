"""Frozen, validated configuration dataclasses shared by every layer (leaves: they import
nothing of pagedattn but the backend names)."""

from pagedattn.config.cache_config import KV_CACHE_DTYPES, POSITION_MODES, CacheConfig
from pagedattn.config.engine_config import EngineConfig
from pagedattn.config.model_config import ACTIVATIONS, ModelConfig
from pagedattn.config.scheduler_config import (
    SPECULATIVE_CHOICES,
    SPECULATIVE_METHODS,
    SchedulerConfig,
    resolve_speculative,
)

__all__ = [
    "ACTIVATIONS",
    "KV_CACHE_DTYPES",
    "POSITION_MODES",
    "SPECULATIVE_CHOICES",
    "SPECULATIVE_METHODS",
    "CacheConfig",
    "EngineConfig",
    "ModelConfig",
    "SchedulerConfig",
    "resolve_speculative",
]
