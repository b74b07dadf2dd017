"""Route each sequence of a batch to the attention kernel its own step calls for.

A sequence with one new token (a decode row, or a one-token prompt chunk) always goes through
:func:`~pagedattn.kernels.paged.paged_attention_decode`, one with more through
:func:`~pagedattn.kernels.paged.paged_attention_prefill`, whatever else shares the batch: the
two kernels round differently, so a decode row computed by the prefill kernel in a mixed batch
would differ (by ~1e-7) from the same row in a decode-only batch (batch invariance).

Each layer may attend with its own sliding window (Gemma 3's local layers, Mistral, Phi-3)
and scale: a layer's window is combined with the batch's engine-wide one (the smaller wins).
"""

from __future__ import annotations

import numpy as np

from pagedattn.kernels.aligned import empty_aligned
from pagedattn.kernels.kv_dtype import logical_shape
from pagedattn.kernels.paged import paged_attention_prefill
from pagedattn.kernels.paged_checks import CacheShape
from pagedattn.kernels.paged_plan import DecodePlan, decode_planned, plan_decode
from pagedattn.model.forward_batch import ForwardBatch


def combined_window(batch_window: int | None, layer_window: int | None) -> int | None:
    """The window a layer with ``layer_window`` (None: full attention) attends with in a batch
    whose engine-wide window is ``batch_window``: the smaller of the two that are set."""
    if layer_window is None or (batch_window is not None and batch_window <= layer_window):
        return batch_window
    return layer_window


class AttentionSplit:
    """The decode / prefill partition of one ForwardBatch, computed once per forward; the
    decode rows' page metadata is validated once too (:mod:`pagedattn.kernels.paged_plan`), at
    the first layer, and reused by every layer.

    Args:
        batch: the step's batch.
    """

    def __init__(self, batch: ForwardBatch) -> None:
        self.batch = batch
        qsl = np.asarray(batch.query_start_loc, dtype=np.int64)
        q_lens = np.diff(qsl)
        single = q_lens == 1
        self.decode_seqs = np.flatnonzero(single)  # sequences with one new token
        self.decode_rows = qsl[:-1][single]  # (num_decode,) their flat rows
        self.prefill_seqs = np.flatnonzero(~single & (q_lens > 0))
        lens = q_lens[self.prefill_seqs]
        self.prefill_qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        self.prefill_rows = np.concatenate(
            [np.arange(qsl[s], qsl[s + 1]) for s in self.prefill_seqs] or [np.zeros(0, np.int64)]
        )
        self._decode_plans: dict[tuple[int | None, float | None], DecodePlan] = {}
        self._window: int | None = batch.sliding_window
        self._scale: float | None = None

    def window(self, layer_window: int | None) -> int | None:
        """The window a layer with ``layer_window`` (None: full attention) attends with in
        this batch: the smaller of it and the batch's engine-wide window."""
        return combined_window(self.batch.sliding_window, layer_window)

    def attention(
        self,
        q: np.ndarray,
        q_sink: np.ndarray | None,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        layer_window: int | None = None,
        scale: float | None = None,
    ) -> np.ndarray:
        """(num_tokens, num_heads, head_dim) float32 attention of every new token.

        Args:
            q: (num_tokens, num_heads, head_dim) float32 rotated queries.
            q_sink: None, or like ``q``: queries rotated to their in-cache positions for sink keys.
            k_cache, v_cache: one layer's (num_pages, num_kv_heads, page_size, head_dim) pool.
            layer_window: the layer's own sliding window, None for full attention.
            scale: multiplier of ``q . k``; None for ``1 / sqrt(head_dim)``.
        """
        b = self.batch
        self._window, self._scale = self.window(layer_window), scale
        if self.decode_only:  # rows are sequences, in order
            return self._decode(q, q_sink, k_cache, v_cache, b.page_tables, b.context_lens)
        if self.decode_seqs.size == 0:
            return self._prefill(
                q, q_sink, k_cache, v_cache, b.page_tables, b.query_start_loc, b.context_lens
            )
        out = empty_aligned(q.shape)  # attn_output's input
        d, p = self.decode_rows, self.prefill_rows
        ds, ps = self.decode_seqs, self.prefill_seqs
        out[d] = self._decode(
            q[d], None if q_sink is None else q_sink[d], k_cache, v_cache,
            b.page_tables[ds], b.context_lens[ds],
        )  # fmt: skip
        out[p] = self._prefill(
            q[p], None if q_sink is None else q_sink[p], k_cache, v_cache,
            b.page_tables[ps], self.prefill_qsl, b.context_lens[ps],
        )  # fmt: skip
        return out

    def _decode(
        self,
        q: np.ndarray,
        q_sink: np.ndarray | None,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        page_tables: np.ndarray,
        context_lens: np.ndarray,
    ) -> np.ndarray:
        shape = logical_shape(k_cache.shape, k_cache.dtype)  # int8: head_dim, not its row width
        plan = self._plan(page_tables, context_lens, shape)  # type: ignore[arg-type]
        return decode_planned(plan, q, q_sink, k_cache, v_cache)

    def _plan(
        self, page_tables: np.ndarray, context_lens: np.ndarray, cache_shape: CacheShape
    ) -> DecodePlan:
        key = (self._window, self._scale)
        plan = self._decode_plans.get(key)
        if plan is None or plan.cache_shape != cache_shape:
            plan = plan_decode(
                page_tables, context_lens, cache_shape, sliding_window=self._window,
                num_sink_tokens=self.batch.num_sink_tokens, scale=self._scale,
            )  # fmt: skip
            self._decode_plans[key] = plan
        return plan

    @property
    def decode_only(self) -> bool:
        """Every sequence of the batch has exactly one new token (rows are sequences)."""
        return bool(self.decode_seqs.size == self.batch.num_seqs)

    def decode_plan(
        self, cache_shape: CacheShape, layer_window: int | None = None, scale: float | None = None
    ) -> DecodePlan:
        """The validated decode metadata of a decode-only batch for a layer with
        ``layer_window`` and ``scale`` (built once per distinct pair, then reused).

        Raises:
            ValueError: the batch is not decode-only, or its metadata is invalid.
        """
        if not self.decode_only:
            raise ValueError("decode_plan: the batch has prefill rows")
        self._window, self._scale = self.window(layer_window), scale
        return self._plan(self.batch.page_tables, self.batch.context_lens, cache_shape)

    def _prefill(
        self,
        q: np.ndarray,
        q_sink: np.ndarray | None,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        page_tables: np.ndarray,
        query_start_loc: np.ndarray,
        context_lens: np.ndarray,
    ) -> np.ndarray:
        out = paged_attention_prefill(
            q, k_cache, v_cache, page_tables, query_start_loc, context_lens, q_sink=q_sink,
            sliding_window=self._window, num_sink_tokens=self.batch.num_sink_tokens,
            scale=self._scale,
        )  # fmt: skip
        assert isinstance(out, np.ndarray)
        return out
