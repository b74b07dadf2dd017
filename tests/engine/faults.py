"""Models that fail on purpose, for fault tests (engine, server, CLI): they wrap a real model
and are handed to the engine in its place; production code has no fault switch."""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.model.forward_batch import ForwardBatch


class FaultyModel:
    """Wraps a model; ``fail_calls`` are the 1-based forward calls that raise (after the
    model wrote nothing: the KV of those slots stays whatever the pool held)."""

    def __init__(self, model: Any, fail_calls: set[int]) -> None:
        self.model = model
        self.config = model.config
        self.fail_calls = fail_calls
        self.calls = 0

    def forward(self, batch: ForwardBatch, kv: Any) -> np.ndarray:
        self.calls += 1
        if self.calls in self.fail_calls:
            raise MemoryError("injected: the forward ran out of memory")
        return np.asarray(self.model.forward(batch, kv))


class RowFaultModel:
    """Wraps a model and spoils the logits rows of queries at position >= ``from_position``
    (only the long-prompt request gets there): ``mode`` "nan" writes NaN, "padded" pushes
    ``padded_id`` far above every real token."""

    def __init__(self, model: Any, mode: str, from_position: int, padded_id: int = 0) -> None:
        self.model = model
        self.config = model.config
        self.mode = mode
        self.from_position = from_position
        self.padded_id = padded_id

    def forward(self, batch: ForwardBatch, kv: Any) -> np.ndarray:
        logits = np.array(self.model.forward(batch, kv))
        rows = batch.positions[batch.logits_indices] >= self.from_position
        if self.mode == "nan":
            logits[rows] = np.nan
        else:
            logits[rows, self.padded_id] = logits[rows].max(axis=-1) + 100.0
        return logits
