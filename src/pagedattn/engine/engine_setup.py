"""What an LLMEngine is built from: its model checked against the config, the name of its
pages (the weights' fingerprint and the cache namespace), its persistent tier, and the limits
the scheduler applies (stop tokens, the longest request).

Each function validates one part of :class:`pagedattn.engine.llm_engine.LLMEngine`'s
construction and raises ``ValueError`` naming the config field at fault.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from pagedattn.cache import PagePool, cache_namespace
from pagedattn.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pagedattn.engine.fingerprint import weights_fingerprint
from pagedattn.engine.model_runner import Model
from pagedattn.model.build import model_backend, resolve_model_backend

if TYPE_CHECKING:
    from pagedattn.backends import BackendSpec
    from pagedattn.storage import KVStore, KVTier


def model_fingerprint_of(model: Model, model_fingerprint: str | None, *, persistent: bool) -> str:
    """The id of the weights that names their pages: ``model_fingerprint`` when given, else
    a digest of the model's config and weights; a model that cannot be digested gets an id
    private to this engine (it shares pages with nobody) unless its pages are ``persistent``.

    Raises:
        ValueError: ``persistent`` (a kv_store) and the weights cannot be digested.
    """
    if model_fingerprint is None:
        model_fingerprint = weights_fingerprint(model)
    if model_fingerprint is None:
        if persistent:
            raise ValueError(
                "model_fingerprint: this model's weights cannot be digested to name its "
                "pages in the kv_store; pass model_fingerprint (a digest of its weights)"
            )
        model_fingerprint = f"engine-private:{uuid.uuid4().hex}"  # shares with nobody
    return model_fingerprint


def check_model(config: EngineConfig, model: Model) -> BackendSpec:
    """The backend ``config`` asks for, after checking that ``model`` runs there and computes
    with ``config.activations``.

    Raises:
        ValueError: a model built for another backend or activations.
        pagedattn.backends.BackendError: the backend's library or device is missing.
    """
    backend = resolve_model_backend(config.backend, config.device)
    if model_backend(model) != backend:
        raise ValueError(
            f"backend: the model runs on {model_backend(model)}, the engine config asks "
            f"for {backend}; build it with pagedattn.model.build.build_model"
        )
    if getattr(model, "activations", "float32") != config.activations:
        raise ValueError(
            f"activations: the model computes with {getattr(model, 'activations', 'float32')}"
            f", the engine config asks for {config.activations}"
        )
    return backend


def engine_namespace(config: EngineConfig, mc: ModelConfig, model_fingerprint: str) -> bytes:
    """The cache namespace of this engine's pages: everything that changes their KV."""
    cc = config.cache
    return cache_namespace(
        model_fingerprint=model_fingerprint,
        dtype=cc.kv_cache_dtype,
        page_size=cc.page_size,
        num_layers=mc.num_layers,
        num_kv_heads=mc.num_kv_heads,
        head_dim=mc.head_dim,
        rope_theta=mc.rope_theta,
        rope_scaling=mc.rope_scaling_key,
        sliding_window=cc.sliding_window,
        num_sink_tokens=cc.num_sink_tokens,
        position_mode=cc.position_mode,
        activations=config.activations,
    )


def open_tier(
    store: KVStore | None, config: EngineConfig, namespace: bytes, pool: PagePool
) -> KVTier | None:
    """The persistent tier over ``store``, or over ``config.kv_store`` opened for ``pool``'s
    pages; None when neither is set.

    Raises:
        ValueError: a tier without prefix caching, or a ``config.kv_store`` that cannot be
            opened (see :func:`pagedattn.storage.open_store`).
    """
    if store is None and config.kv_store is None:
        return None
    if not config.cache.enable_prefix_caching:
        raise ValueError("kv_store: needs prefix caching (pages are named by prefix hash)")
    from pagedattn.storage import KVTier, open_store

    if store is None:
        assert config.kv_store is not None
        # int8 pages persist as they lie in the pool: codes and scales, never re-expanded
        page_shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.row_width)
        store = open_store(
            config.kv_store, namespace, page_shape, pool.dtype, key=config.kv_store_key
        )
    return KVTier(store, pool, lookup_deadline_s=config.kv_store_deadline_s)


def stop_token_ids(tokenizer: Any, mc: ModelConfig) -> frozenset[int]:
    """End-of-sequence ids: the tokenizer's stop tokens, else the model config's eos id."""
    if tokenizer is not None:
        return frozenset(tokenizer.stop_token_ids)
    return frozenset() if mc.eos_token_id is None else frozenset({mc.eos_token_id})


def max_model_len(cc: CacheConfig, sc: SchedulerConfig, mc: ModelConfig) -> int | None:
    """The most tokens one request may hold: ``sc.max_model_len``, else the model's context
    when positions are bounded by it (absolute positions, no window); None = unbounded."""
    if sc.max_model_len is None and cc.position_mode == "absolute" and cc.sliding_window is None:
        return mc.max_position_embeddings
    return sc.max_model_len
