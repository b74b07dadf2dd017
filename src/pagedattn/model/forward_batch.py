"""ForwardBatch: everything one model forward needs, as explicit arrays (no global state)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ForwardBatch:
    """One flat batch of new tokens from several sequences (vLLM's "attention metadata").

    Sequence s owns rows ``query_start_loc[s]:query_start_loc[s + 1]`` of every per-token array.
    Its new tokens are the last ``q_len`` of its ``context_lens[s]`` KV tokens (bottom-right
    aligned causal mask), and their K/V are written to ``slot_mapping`` before attention.

    Attributes:
        input_ids: (num_tokens,) int64 token ids of the new tokens, sequence-major.
        positions: (num_tokens,) int64 RoPE position of each new token.
        slot_mapping: (num_tokens,) int64 KV slot (page_id * page_size + offset) of each token.
        query_start_loc: (num_seqs + 1,) int32 offsets of each sequence's rows; starts at 0.
        context_lens: (num_seqs,) int32 KV tokens each sequence attends over, new ones included.
        page_tables: (num_seqs, max_pages_per_seq) int32 page ids in position order; -1 where a
            page was never allocated or was evicted (the kernels never read those entries).
        logits_indices: (num_outputs,) int64 rows whose logits the caller needs (usually the
            last new token of each sequence that samples); the LM head runs only on these.
        sliding_window: W, or None for full attention (p - W < j <= p is visible).
        num_sink_tokens: S, the first S tokens stay visible whatever the window.
        sink_positions: None (absolute positions), or (num_tokens,) int64 the in-cache position
            each query takes against sink keys (StreamingLLM "shifted" mode, arXiv 2309.17453).
        layer_groups: None (every layer reads ``page_tables`` and writes ``slot_mapping``), or
            the layer group of each layer (a hybrid KV cache,
            :mod:`pagedattn.cache.layer_groups`): group 0's layers use ``page_tables`` and
            ``slot_mapping``, group ``g >= 1``'s use ``group_kv[g - 1]``.
        group_kv: per layer group after the first, its ``(slot_mapping, page_tables)`` shaped
            as ``slot_mapping`` and as ``page_tables`` (rows).
    """

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    query_start_loc: np.ndarray
    context_lens: np.ndarray
    page_tables: np.ndarray
    logits_indices: np.ndarray
    sliding_window: int | None = None
    num_sink_tokens: int = 0
    sink_positions: np.ndarray | None = None
    layer_groups: tuple[int, ...] | None = None
    group_kv: tuple[tuple[np.ndarray, np.ndarray], ...] = ()

    def __post_init__(self) -> None:
        n = self.input_ids.shape[0]
        for name in ("positions", "slot_mapping"):
            arr = getattr(self, name)
            if arr.shape != (n,):
                raise ValueError(f"ForwardBatch.{name}: expected shape ({n},), got {arr.shape}")
        if self.sink_positions is not None and self.sink_positions.shape != (n,):
            raise ValueError(
                f"ForwardBatch.sink_positions: expected shape ({n},), "
                f"got {self.sink_positions.shape}"
            )
        num_seqs = self.context_lens.shape[0]
        if self.query_start_loc.shape != (num_seqs + 1,):
            raise ValueError(
                f"ForwardBatch.query_start_loc: expected shape ({num_seqs + 1},), "
                f"got {self.query_start_loc.shape}"
            )
        if self.page_tables.ndim != 2 or self.page_tables.shape[0] != num_seqs:
            raise ValueError(
                f"ForwardBatch.page_tables: expected shape ({num_seqs}, max_pages_per_seq), "
                f"got {self.page_tables.shape}"
            )
        if num_seqs and (self.query_start_loc[0] != 0 or self.query_start_loc[-1] != n):
            raise ValueError(
                f"ForwardBatch.query_start_loc must start at 0 and end at num_tokens={n}"
            )

        groups = 1 + len(self.group_kv)
        if self.layer_groups is not None and set(self.layer_groups) != set(range(groups)):
            raise ValueError(
                f"ForwardBatch.layer_groups: expected groups 0..{groups - 1}, "
                f"got {sorted(set(self.layer_groups))}"
            )
        for g, (slots, tables) in enumerate(self.group_kv, start=1):
            if slots.shape != (n,) or tables.ndim != 2 or tables.shape[0] != num_seqs:
                raise ValueError(
                    f"ForwardBatch.group_kv[{g - 1}]: expected slots ({n},) and tables "
                    f"({num_seqs}, max_pages_per_seq), got {slots.shape} and {tables.shape}"
                )

    @property
    def num_groups(self) -> int:
        """Layer groups with their own page tables (1 without a hybrid KV cache)."""
        return 1 + len(self.group_kv)

    def group_of(self, layer: int) -> int:
        """The layer group of model layer ``layer``."""
        return 0 if self.layer_groups is None else self.layer_groups[layer]

    def for_group(self, group: int) -> ForwardBatch:
        """The batch as layer group ``group``'s layers see it: its slots and page tables."""
        if group == 0:
            return self
        slots, tables = self.group_kv[group - 1]
        return dataclasses.replace(
            self, slot_mapping=slots, page_tables=tables, layer_groups=None, group_kv=()
        )

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        """True when every sequence has exactly one new token (use the decode kernel)."""
        return self.num_tokens == self.num_seqs
