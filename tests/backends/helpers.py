"""Engines on any backend for the tiny random model, and a logits recorder."""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.backends import BackendSpec
from pagedattn.config import CacheConfig, EngineConfig, SchedulerConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.llama import LlamaModel
from pagedattn.sampling_params import SamplingParams
from tests.engine.helpers import drain, tokens
from tests.model.tiny import random_weights, tiny_config


def tiny_on(spec: BackendSpec, seed: int = 0) -> Any:
    """The tiny random Llama (tests/model/tiny.py, ``seed``) built for ``spec``."""
    config = tiny_config()
    weights = random_weights(config, seed)
    if spec.name == "numpy":
        return LlamaModel(config, weights)
    from pagedattn.model.torch_model import TorchLlamaModel

    return TorchLlamaModel(config, weights, device=spec.device)


class Recorder:
    """Wraps a model; keeps every step's returned logits (float32, host)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        self.backend = getattr(model, "backend", BackendSpec("numpy", "cpu"))
        self.logits: list[np.ndarray] = []

    def forward(self, batch: ForwardBatch, kv: Any) -> np.ndarray:
        out = np.asarray(self.model.forward(batch, kv))
        self.logits.append(out)
        return out


def engine_on(spec: BackendSpec, model: Any, **kwargs: Any) -> LLMEngine:
    """An engine on ``spec`` whose CacheConfig / SchedulerConfig fields (and ``kv_store``)
    come from ``kwargs``."""
    cache_keys = set(CacheConfig.__dataclass_fields__)
    store = kwargs.pop("kv_store", None)
    cache = CacheConfig(**{k: v for k, v in kwargs.items() if k in cache_keys})
    sched = SchedulerConfig(**{k: v for k, v in kwargs.items() if k not in cache_keys})
    config = EngineConfig(
        cache=cache, scheduler=sched, backend=spec.name, device=spec.device, kv_store=store
    )
    return LLMEngine(config, model)


def run(
    spec: BackendSpec, model: Any, requests: list[tuple[str, Any, SamplingParams]], **kwargs: Any
) -> tuple[dict[str, list[int]], LLMEngine]:
    """Token ids per request id (all requests added at step 0), and the drained engine."""
    engine = engine_on(spec, model, **kwargs)
    outs = drain(engine, {0: requests})
    return {rid: tokens(o) for rid, o in outs.items()}, engine
