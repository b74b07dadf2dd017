"""Opt-in unfused profiling forward: the model's own general path, each operation timed.

The fast path (:meth:`pagedattn.model.decoder.DecoderModel.forward`) runs a decode step's
layers as one compiled call each, with no timers. For ``pagedattn profile --unfused`` this
module runs the model's general path (:func:`pagedattn.model.layer_loop.run_layer`, the same
code every step of more rows takes, so the logits are those of the unhooked model; a test
checks it) with a timing hook around each operation, adding seconds per layer and per kind of
op: ``matmul`` (the layers' projections), ``lm_head`` (the logits' projection: with a large
vocabulary, e.g. Gemma 3's 262k rows, a large share of a decode step), ``attention`` (write_kv
+ paged kernel), ``rope``, ``norm``, ``activation`` (the gated MLP activation), ``embedding``.
Timers cost a few microseconds per op, which is why this mode is labelled.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from pagedattn.model.decoder import DecoderModel
from pagedattn.model.forward_batch import ForwardBatch


class UnfusedProfiler:
    """Wraps a :class:`DecoderModel`; ``forward`` gives the same logits and fills ``by_op`` /
    ``by_layer`` (seconds, accumulated over calls)."""

    def __init__(self, model: DecoderModel) -> None:
        self.model = model
        self.config = model.config
        self.by_op: defaultdict[str, float] = defaultdict(float)
        self.by_layer: defaultdict[int, float] = defaultdict(float)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def _hook(self, kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - began
            if kind == "layer":  # run_layer(config, li, ...): its ops are timed inside
                self.by_layer[args[1]] += spent
            else:
                self.by_op[kind] += spent

    def forward(
        self, batch: ForwardBatch, kv: np.ndarray, attention_mass: np.ndarray | None = None
    ) -> np.ndarray:
        """As :meth:`DecoderModel.forward` (same arguments, result and errors)."""
        return self.model.forward(batch, kv, attention_mass, hook=self._hook)
