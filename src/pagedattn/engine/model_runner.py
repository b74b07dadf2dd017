"""ModelRunner: scheduled sequences -> ForwardBatch -> logits -> sampled token ids.

Position modes (DESIGN.md "Positions under eviction"): keys are always written with their
absolute RoPE positions. RoPE scores depend only on the query-key distance, so window keys
need nothing in either mode. In ``shifted`` mode (StreamingLLM, arXiv 2309.17453: positions
counted inside the cache) a query at absolute position ``p`` sits at in-cache position
``min(p, S + W - 1)`` once the window has moved past the sinks; sink keys keep their in-cache
positions ``0..S-1``, so the model scores sink keys with the query rotated to that in-cache
position (``ForwardBatch.sink_positions``) and everything matches a dense forward over exactly
the retained tokens at positions ``0..n-1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pagedattn.config import CacheConfig
from pagedattn.engine.sampler import sample_each
from pagedattn.engine.scheduled_batch import ScheduledBatch
from pagedattn.model.forward_batch import ForwardBatch


class Model(Protocol):
    """What the runner calls: ``pagedattn.model.llama.LlamaModel`` implements it."""

    def forward(self, batch: ForwardBatch, kv: Any) -> np.ndarray: ...


@dataclass(frozen=True)
class SampledTokens:
    """What one step sampled.

    Attributes:
        token_ids: (num sampling sequences,) int64 ids in batch order; -1 in a failed row.
        errors: row -> why that row has no token (its request fails alone).
    """

    token_ids: np.ndarray
    errors: dict[int, str] = field(default_factory=dict)


class ModelRunner:
    """Builds the ForwardBatch of a step, runs the model and samples.

    Args:
        model: the model; ``forward(batch, kv)`` returns float32 logits
            ``(len(batch.logits_indices), vocab)``.
        kv: the KV storage passed through to the model (the page pool).
        cache_config: page size, window, sinks and position mode.
        num_valid_tokens: the tokenizer's vocabulary size when the model's embedding has more
            (padded) rows: logits of ids at or above it are set to -inf before sampling, so
            such an id is never sampled; None = every id is a token.
    """

    def __init__(
        self,
        model: Model,
        kv: Any,
        cache_config: CacheConfig,
        num_valid_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.kv = kv
        self.cache_config = cache_config
        self.num_valid_tokens = num_valid_tokens

    def build(self, batch: ScheduledBatch) -> ForwardBatch:
        """The ForwardBatch of a step (see :class:`ForwardBatch` for every array's layout).

        Raises:
            ValueError: an empty batch, or a slot_mapping whose length is not num_new_tokens.
        """
        if not batch.seqs:
            raise ValueError("build: expected at least one scheduled sequence, got none")
        input_ids, positions, slots = [], [], []
        query_start_loc = [0]
        context_lens, logits_indices = [], []
        for s in batch.seqs:
            start, n = s.start, s.num_new_tokens
            if s.slot_mapping.shape != (n,):
                raise ValueError(
                    f"request {s.seq.request_id!r}: slot_mapping expected shape ({n},), "
                    f"got {s.slot_mapping.shape}"
                )
            input_ids.append(np.asarray(s.seq.token_ids[start : start + n], dtype=np.int64))
            positions.append(np.arange(start, start + n, dtype=np.int64))
            slots.append(s.slot_mapping.astype(np.int64, copy=False))
            query_start_loc.append(query_start_loc[-1] + n)
            context_lens.append(start + n)
            if s.samples:
                logits_indices.append(query_start_loc[-1] - 1)
        pos = np.concatenate(positions)
        cfg = self.cache_config
        sink_positions = None
        if cfg.position_mode == "shifted" and cfg.num_sink_tokens > 0:
            assert cfg.sliding_window is not None  # CacheConfig guarantees it
            sink_positions = np.minimum(pos, cfg.num_sink_tokens + cfg.sliding_window - 1)
        return ForwardBatch(
            input_ids=np.concatenate(input_ids),
            positions=pos,
            slot_mapping=np.concatenate(slots),
            query_start_loc=np.asarray(query_start_loc, dtype=np.int32),
            context_lens=np.asarray(context_lens, dtype=np.int32),
            page_tables=np.asarray(batch.page_tables, dtype=np.int32),
            logits_indices=np.asarray(logits_indices, dtype=np.int64),
            sliding_window=cfg.sliding_window,
            num_sink_tokens=cfg.num_sink_tokens,
            sink_positions=sink_positions,
        )

    def logits(self, batch: ScheduledBatch) -> np.ndarray:
        """(num sampling sequences, vocab) float32 logits of a step (runs the model once);
        padded ids (see ``num_valid_tokens``) are -inf."""
        logits = np.asarray(self.model.forward(self.build(batch), self.kv))
        n = self.num_valid_tokens
        if n is not None and n < logits.shape[-1]:
            logits = logits.copy() if not logits.flags.writeable else logits
            logits[:, n:] = -np.inf
        return logits

    def run(self, batch: ScheduledBatch) -> SampledTokens:
        """Run one step.

        Returns:
            The sampled ids, (len(batch.sampling_seqs),) int64 in batch order, and the rows
            that failed (NaN logits, a logits processor raising...); empty (and no model call)
            when nothing is scheduled.

        Raises:
            Whatever the model raises: the whole step failed.
        """
        if not batch.seqs:
            return SampledTokens(np.zeros(0, dtype=np.int64))
        logits = self.logits(batch)
        seqs = batch.sampling_seqs
        if not seqs:
            return SampledTokens(np.zeros(0, dtype=np.int64))
        processed = any(s.params.logits_processors for s in seqs)
        ids, errors = sample_each(
            logits,
            [s.params for s in seqs],
            [s.generator for s in seqs],
            [s.output_token_ids for s in seqs] if processed else None,
            self.num_valid_tokens,
        )
        return SampledTokens(ids, errors)
