"""Paged attention in PyTorch: gather each sequence's pages by page table, then SDPA.

The pool layout is :mod:`pagedattn.kernels.paged`'s: one layer's K (or V) is
``(num_pages, num_kv_heads, page_size, head_dim)`` and token ``j`` of sequence ``s`` lives at
``page_tables[s, j // page_size] * page_size + j % page_size`` (PagedAttention, Kwon et al.
2023, arXiv 2309.06180). :class:`TorchStepAttention` is built once per forward from the
step's host tables (moved to the device once); every layer then gathers the pages of the
table columns some sequence holds (evicted pages are ``-1``, so a windowed stream reads its
window and sinks only) as ``(num_seqs, num_kv_heads, num_keys, head_dim)`` and calls
``torch.nn.functional.scaled_dot_product_attention`` with a boolean mask that follows
:func:`pagedattn.kernels.reference.visible_mask` exactly: query row ``i`` of a sequence with
``q_len`` new tokens and ``context_len`` keys sits at ``p = context_len - q_len + i`` and sees
key ``j`` iff ``j <= p``, ``j``'s page is present (page id ``>= 0``), and, with a sliding
window ``W``, ``j > p - W`` or ``j < num_sink_tokens`` (StreamingLLM sinks, arXiv 2309.17453).

Sink keys scored with other queries (``q_sink``, the "shifted" position mode) use one SDPA
call over a doubled head dimension: ``q' = [q, q_sink]``, ``k'_j = [k_j, 0]`` for ``j >= S``
and ``[0, k_j]`` for ``j < S``, so ``q' . k'_j`` is ``q . k_j`` or ``q_sink . k_j`` exactly
(the scale stays the layer's). Grouped-query attention (Ainslie et al. 2023) is
SDPA's ``enable_gqa``. Decode rows (sequences with one new token) and prefill rows are two
SDPA calls, so a decode row is never padded to the longest prompt chunk of the step.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pagedattn.model.attention_split import combined_window
from pagedattn.model.forward_batch import ForwardBatch


class TorchStepAttention:
    """One step's attention metadata on the device, shared by every layer.

    Args:
        torch: the imported ``torch`` module.
        batch: the step's ForwardBatch (host NumPy ints).
        page_size: tokens per page of the pool.
        num_pages: pages in the pool (slots and page ids are checked against it).
        device: the pool's ``torch.device``.
        layer_window: the layer's own sliding window (None: full attention), combined with
            the batch's (:func:`pagedattn.model.attention_split.combined_window`).
        scale: multiplier of ``q . k``; None for ``1 / sqrt(head_dim)``.

    Raises:
        ValueError: a slot or page id out of the pool, a ``q_len > context_len``, or a
            context longer than its page table holds (the message names the field).
    """

    def __init__(
        self,
        torch: Any,
        batch: ForwardBatch,
        page_size: int,
        num_pages: int,
        device: Any,
        *,
        layer_window: int | None = None,
        scale: float | None = None,
    ) -> None:
        self.torch = torch
        sliding_window = combined_window(batch.sliding_window, layer_window)
        qsl = np.asarray(batch.query_start_loc, dtype=np.int64)
        q_lens = np.diff(qsl)
        ctx = np.asarray(batch.context_lens, dtype=np.int64)
        tables = np.asarray(batch.page_tables, dtype=np.int64)
        if np.any(q_lens > ctx):
            raise ValueError("context_lens: expected >= q_len for every sequence")
        max_ctx = int(ctx.max(initial=0))
        num_table_pages = -(-max_ctx // page_size)
        if num_table_pages > tables.shape[1]:
            raise ValueError(
                f"page_tables: context of {max_ctx} tokens needs {num_table_pages} pages, "
                f"the table holds {tables.shape[1]}"
            )
        tables = tables[:, :num_table_pages]
        if np.any(tables >= num_pages) or np.any(tables < -1):
            raise ValueError(f"page_tables: expected page ids in [0, {num_pages}) or -1")
        slots = np.asarray(batch.slot_mapping, dtype=np.int64)
        num_slots = num_pages * page_size
        if np.any((slots < -1) | (slots >= num_slots)):
            raise ValueError(f"slot_mapping: expected slots in [0, {num_slots}) or -1")
        keep = np.flatnonzero(slots >= 0)

        def as_dev(a: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(a)).to(device)

        self.write_rows = as_dev(keep)
        self.write_pages = as_dev(slots[keep] // page_size)
        self.write_offsets = as_dev(slots[keep] % page_size)
        single = q_lens == 1
        self.groups = [
            _Group(torch, batch, seqs, qsl, tables, page_size, as_dev, sliding_window, scale)
            for seqs in (np.flatnonzero(single), np.flatnonzero(~single & (q_lens > 0)))
            if seqs.size
        ]

    def write_kv(self, k_cache: Any, v_cache: Any, k: Any, v: Any) -> None:
        """Store the new tokens' K/V at their slots, in place (``-1`` slots are skipped).

        Args:
            k_cache, v_cache: one layer's ``(num_pages, num_kv_heads, page_size, head_dim)``.
            k, v: ``(num_tokens, num_kv_heads, head_dim)``, cast to the pool's dtype.
        """
        pages, offsets, rows = self.write_pages, self.write_offsets, self.write_rows
        k_cache[pages, :, offsets] = k[rows].to(k_cache.dtype)
        v_cache[pages, :, offsets] = v[rows].to(v_cache.dtype)

    def attention(self, q: Any, q_sink: Any | None, k_cache: Any, v_cache: Any) -> Any:
        """Attention of every new token over its sequence's visible keys.

        Args:
            q: ``(num_tokens, num_heads, head_dim)`` rotated queries (any float dtype).
            q_sink: None, or like ``q``: queries that score the sink keys ``j < S``.
            k_cache, v_cache: one layer's ``(num_pages, num_kv_heads, page_size, head_dim)``.

        Returns:
            ``(num_tokens, num_heads, head_dim)`` of ``q``'s dtype.
        """
        out = self.torch.zeros_like(q)
        for group in self.groups:
            out[group.out_rows] = group.attention(q, q_sink, k_cache, v_cache)
        return out


class _Group:
    """The padded SDPA problem of some of the step's sequences (all decode, or all prefill).

    Query rows are padded to ``(num_seqs, max_q)``; keys are the table columns some sequence
    of the group holds a page in (evicted pages are -1, so a long windowed stream gathers its
    window and sinks only), masked per (sequence, row, key).
    """

    def __init__(
        self,
        torch: Any,
        batch: ForwardBatch,
        seqs: np.ndarray,
        qsl: np.ndarray,
        tables: np.ndarray,
        page_size: int,
        as_dev: Any,
        window: int | None,
        scale: float | None,
    ) -> None:
        self.torch = torch
        self.num_sink_tokens = batch.num_sink_tokens
        self.scale = scale
        q_lens = np.diff(qsl)[seqs]
        ctx = np.asarray(batch.context_lens, dtype=np.int64)[seqs]
        tables = tables[seqs]
        num_seqs, max_q = len(seqs), int(q_lens.max())
        i = np.arange(max_q)[None, :]
        row_valid = i < q_lens[:, None]  # (num_seqs, max_q)
        rows = np.where(row_valid, qsl[seqs, None] + i, 0)
        self.q_rows = as_dev(rows)
        self.row_valid = as_dev(row_valid)
        self.out_rows = as_dev(rows[row_valid])  # flat rows of the valid entries, row-major
        cols = np.flatnonzero((tables >= 0).any(axis=0))
        tables = tables[:, cols]
        self.tables = as_dev(np.maximum(tables, 0))
        key_pos = (cols[:, None] * page_size + np.arange(page_size)).ravel()  # (keys,)
        j = key_pos[None, None, :]
        pos = (ctx - q_lens)[:, None, None] + i[:, :, None]  # (num_seqs, max_q, 1)
        present = np.repeat(tables >= 0, page_size, axis=1)[:, None, :]  # (num_seqs, 1, keys)
        mask = (j <= pos) & present
        if window is not None:
            mask &= (j > pos - window) | (j < batch.num_sink_tokens)
        # a real row that sees no key gives zeros (as the reference); SDPA would give NaN
        self.row_sees = as_dev(np.asarray(mask.any(axis=-1))[:, None, :, None])
        mask |= ~row_valid[:, :, None]  # padded rows see every key (their output is dropped)
        # Keys past the context or on absent pages are zeroed before SDPA: a masked key's
        # weight is 0, but 0 * NaN (a never-written slot) would still poison the row.
        self.key_ok = as_dev((j[0] < ctx[:, None]) & present[:, 0])[:, None, :, None]
        self.mask = as_dev(mask[:, None])  # (num_seqs, 1, max_q, keys)
        self.is_sink = as_dev((key_pos < batch.num_sink_tokens)[:, None])
        self.shape = (num_seqs, max_q, key_pos.size)

    def _gather(self, cache: Any, dtype: Any) -> Any:
        """``(num_seqs, num_kv_heads, num_keys, head_dim)`` keys or values in position order."""
        num_seqs, _, num_keys = self.shape
        pages = cache[self.tables]  # (num_seqs, pages, nkv, page_size, D)
        pages = pages.permute(0, 2, 1, 3, 4)  # (num_seqs, nkv, pages, page_size, D)
        keys = pages.reshape(num_seqs, cache.shape[1], num_keys, cache.shape[3]).to(dtype)
        return self.torch.where(self.key_ok, keys, 0)  # (num_seqs, nkv, keys, D)

    def attention(self, q: Any, q_sink: Any | None, k_cache: Any, v_cache: Any) -> Any:
        """``(rows of this group, num_heads, head_dim)`` in :attr:`out_rows` order."""
        torch = self.torch
        if self.shape[2] == 0:  # no key anywhere: every row is zero
            rows = self.out_rows.shape[0]
            return torch.zeros((rows, *q.shape[1:]), dtype=q.dtype, device=q.device)
        qp = q[self.q_rows].transpose(1, 2)  # (num_seqs, nh, max_q, D)
        k = self._gather(k_cache, q.dtype)  # (num_seqs, nkv, keys, D)
        v = self._gather(v_cache, q.dtype)
        if q_sink is not None and self.num_sink_tokens > 0:
            qs = q_sink[self.q_rows].transpose(1, 2)
            qp = torch.cat([qp, qs], dim=-1)  # (num_seqs, nh, max_q, 2 D)
            sink = self.is_sink.to(k.dtype)  # (keys, 1)
            k = torch.cat([k * (1 - sink), k * sink], dim=-1)  # (num_seqs, nkv, keys, 2 D)
        out = torch.nn.functional.scaled_dot_product_attention(
            qp,
            k,
            v,
            attn_mask=self.mask,
            scale=1.0 / math.sqrt(q.shape[-1]) if self.scale is None else self.scale,
            enable_gqa=qp.shape[1] != k.shape[1],
        )  # (num_seqs, nh, max_q, D)
        out = torch.where(self.row_sees, out, 0)
        return out.transpose(1, 2)[self.row_valid]  # (rows, nh, D), sequence-major
