"""Tiny-model engine helpers: build engines, run requests, record logits, dense oracle."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from tests.model.tiny import random_weights, tiny_config

from pagedattn.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.engine.outputs import RequestOutput
from pagedattn.kernels.reference import reference_attention
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.llama import LlamaModel
from pagedattn.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def tiny_model(seed: int = 0, **overrides: Any) -> LlamaModel:
    """The model helper's tiny random Llama (2 layers, hidden 64, 4 heads, 2 kv heads)."""
    config = tiny_config(**overrides)
    return LlamaModel(config, random_weights(config, seed))


def make_engine(model: Any, tokenizer: Any = None, seed: int = 0, **kwargs: Any) -> LLMEngine:
    """An engine whose CacheConfig / SchedulerConfig fields come from ``kwargs``."""
    cache_fields = {f.name for f in dataclasses.fields(CacheConfig)}
    cache = CacheConfig(**{k: v for k, v in kwargs.items() if k in cache_fields})
    sched = SchedulerConfig(**{k: v for k, v in kwargs.items() if k not in cache_fields})
    return LLMEngine(EngineConfig(cache=cache, scheduler=sched, seed=seed), model, tokenizer)


def drain(
    engine: LLMEngine, arrivals: dict[int, list[tuple[str, Any, SamplingParams]]] | None = None
) -> dict[str, list[RequestOutput]]:
    """Step until idle; ``arrivals[step]`` = requests (id, prompt, params) added before it."""
    arrivals = arrivals or {}
    outs: dict[str, list[RequestOutput]] = {}
    step = 0
    while engine.has_unfinished_requests() or any(s >= step for s in arrivals):
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(prompt, params, request_id=rid)
            outs[rid] = []
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
        step += 1
    return outs


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for c in o.outputs for t in c.token_ids]


def solo(model: Any, prompt: Sequence[int], params: SamplingParams, **kwargs: Any) -> list[int]:
    """Token ids of one request run alone on a roomy engine."""
    kwargs = {"page_size": 4, "num_pages": 256, **kwargs}
    engine = make_engine(model, **kwargs)
    return tokens(drain(engine, {0: [("solo", list(prompt), params)]})["solo"])


def assert_all_pages_free(engine: LLMEngine) -> None:
    manager = engine.cache_manager
    manager.check_integrity()
    assert manager.allocator.num_free_pages == manager.num_pages


class RecordingModel:
    """Wraps a model; records the logits of every computed token by (seq row key, position).

    ``records[(first_token_id_tuple_key, position)]`` is keyed by the batch row's sequence index
    within the step and its absolute position; tests use ``by_position`` for single sequences.
    """

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.config = model.config
        self.by_position: dict[int, np.ndarray] = {}
        self.batches: list[ForwardBatch] = []

    def forward(self, batch: ForwardBatch, kv: np.ndarray) -> np.ndarray:
        self.batches.append(batch)
        every = dataclasses.replace(batch, logits_indices=np.arange(batch.num_tokens))
        logits = self.model.forward(every, kv)
        for row, pos in enumerate(batch.positions.tolist()):
            self.by_position[pos] = logits[row]
        return logits[np.asarray(batch.logits_indices, dtype=np.int64)]


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w).astype(np.float32)


def _rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """HF rotate-half RoPE (Su et al. 2021, arXiv 2104.09864), angles in float64."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
    ang = positions.astype(np.float64)[:, None] * inv[None]  # (T, d/2)
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]  # (T, 1, d)
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return (x * cos + rot * sin).astype(np.float32)


def dense_forward(
    config: ModelConfig,
    weights: dict[str, np.ndarray],
    token_ids: Sequence[int],
    *,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
) -> np.ndarray:
    """(T, vocab) float32 logits of every token: a plain dense Llama with the given mask,
    positions 0..T-1 (the oracle; attention by ``reference_attention``)."""
    c = config
    ids = np.asarray(token_ids, np.int64)
    T, nh, nkv, D = len(ids), c.num_heads, c.num_kv_heads, c.head_dim
    pos = np.arange(T)
    x = weights["model.embed_tokens.weight"][ids].astype(np.float32)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        h = _rms(x, weights[p + "input_layernorm.weight"], c.rms_norm_eps)
        q = (h @ weights[p + "self_attn.q_proj.weight"].T).reshape(T, nh, D)
        k = (h @ weights[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, D)
        v = (h @ weights[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, D)
        attn = reference_attention(
            _rope(q, pos, c.rope_theta),
            _rope(k, pos, c.rope_theta),
            np.ascontiguousarray(v, dtype=np.float32),
            sliding_window=sliding_window,
            num_sink_tokens=num_sink_tokens,
        )
        assert isinstance(attn, np.ndarray)
        x = x + attn.reshape(T, nh * D) @ weights[p + "self_attn.o_proj.weight"].T
        h = _rms(x, weights[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        gate = h @ weights[p + "mlp.gate_proj.weight"].T
        up = h @ weights[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ weights[p + "mlp.down_proj.weight"].T
    h = _rms(x, weights["model.norm.weight"], c.rms_norm_eps)
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    return np.asarray(h @ head.T, dtype=np.float32)


def model_with_weights(seed: int = 0, **overrides: Any) -> tuple[LlamaModel, dict[str, Any]]:
    config = tiny_config(**overrides)
    weights = random_weights(config, seed)
    return LlamaModel(config, weights), weights
