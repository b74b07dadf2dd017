"""The perplexity lab's page tables: one per layer group of the model, over one shared pool.

A model whose layers all attend alike has one group (every layer). A hybrid model (Gemma 3:
sliding-window layers beside full-attention ones, :mod:`pagedattn.cache.layer_groups`) keeps a
table per group, as the engine's hybrid KV cache does: the full-attention group's pages are
what the eviction policy keeps; a sliding group keeps the pages its window sees (the smaller of
its own window and the policy's, as the engine's :func:`effective_window`), plus the policy's
sink pages. Each group draws page ids from its own range of the pool, and a page holds only its
group's layers' K and V (the other layers' rows of that id are never written).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.cache.layer_groups import LayerGroup, effective_window, group_of_layers, layer_groups
from pagedattn.eval.kv_pools import make_pool


def model_groups(model: Any) -> tuple[LayerGroup, ...]:
    """The layer groups the lab keeps tables for: the model's groups when they mix windows
    (full attention beside sliding windows), else one group of every layer (None window: the
    kernels apply any uniform model window as a mask)."""
    c = model.config
    groups = layer_groups(c.num_layers, c.layer_windows)
    if len(groups) > 1 and any(g.window for g in groups):
        return groups
    return (LayerGroup(None, tuple(range(c.num_layers))),)


def is_hybrid(model: Any) -> bool:
    """True when ``model`` keeps more than one layer group (see :func:`model_groups`)."""
    return len(model_groups(model)) > 1


def group_name(group: LayerGroup) -> str:
    """``full`` or ``sliding_W``, as the engine's ``kv_groups`` stats name them."""
    return "full" if group.window is None else f"sliding_{group.window}"


class GroupTable:
    """One layer group's page table for one sequence, over ids ``base .. base + num_pages``."""

    def __init__(self, group: LayerGroup, num_tokens: int, page_size: int, base: int, n: int):
        self.group = group
        self.page_size = page_size
        self.table = np.full((1, -(-num_tokens // page_size)), -1, np.int32)
        self.free = list(range(base + n - 1, base - 1, -1))
        self.num_pages = n
        self.peak = 0

    def resident(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.table[0] >= 0)]

    def slots(self, start: int, count: int) -> np.ndarray:
        """Slots of positions ``start .. start + count``, opening pages as needed."""
        pos = np.arange(start, start + count)
        for i in range(start // self.page_size, (start + count - 1) // self.page_size + 1):
            if self.table[0, i] < 0:
                if not self.free:
                    raise RuntimeError(
                        f"page pool exhausted in layer group {group_name(self.group)}: "
                        "the policy exceeded its budget"
                    )
                self.table[0, i] = self.free.pop()
        self.peak = max(self.peak, int((self.table[0] >= 0).sum()))
        return np.asarray(
            self.table[0, pos // self.page_size].astype(np.int64) * self.page_size
            + pos % self.page_size
        )

    def evict_all_but(self, keep: list[int]) -> None:
        kept = set(keep)
        for i in self.resident():
            if i not in kept:
                self.free.append(int(self.table[0, i]))
                self.table[0, i] = -1


class GroupedSequence:
    """One sequence's tables, one per layer group, over one pool of every group's pages.

    Group 0 (full attention, or every layer) follows the policy within ``policy_pages``; a
    sliding group holds its sink pages plus what its window and one step of ``step_tokens``
    tokens can touch.
    """

    def __init__(
        self,
        model: Any,
        num_tokens: int,
        page_size: int,
        policy_pages: int,
        dtype: str,
        *,
        policy_window: int | None,
        num_sink_tokens: int,
        step_tokens: int,
    ) -> None:
        self.groups = model_groups(model)
        self.page_size = page_size
        self.num_sink_tokens = num_sink_tokens
        total = -(-num_tokens // page_size)
        sink_pages = -(-num_sink_tokens // page_size)
        self.windows: list[int | None] = []
        counts = []
        for g, group in enumerate(self.groups):
            w = None if group.window is None else effective_window(policy_window, group.window)
            self.windows.append(w)
            sliding = sink_pages + (w or 0) // page_size + step_tokens // page_size + 3
            need = policy_pages if g == 0 or w is None else sliding
            counts.append(min(need, total))
        self.tables: list[GroupTable] = []
        base = 0
        for group, n in zip(self.groups, counts, strict=True):
            self.tables.append(GroupTable(group, num_tokens, page_size, base, n))
            base += n
        self.kv = make_pool(model, base, page_size, dtype)
        self.layer_groups = (
            group_of_layers(self.groups, model.config.num_layers) if len(self.groups) > 1 else None
        )
        self.page_layer_bytes = int(self.kv.nbytes) // max(base * model.config.num_layers, 1)

    @property
    def policy_table(self) -> GroupTable:
        return self.tables[0]

    def slots(self, start: int, count: int) -> list[np.ndarray]:
        """Each group's slots of positions ``start .. start + count``."""
        return [t.slots(start, count) for t in self.tables]

    def batch_fields(self, slots: list[np.ndarray]) -> dict[str, Any]:
        """The :class:`ForwardBatch` fields that carry the tables and slots."""
        return {
            "slot_mapping": slots[0],
            "page_tables": self.tables[0].table,
            "layer_groups": self.layer_groups,
            "group_kv": tuple(
                (s, t.table) for s, t in zip(slots[1:], self.tables[1:], strict=True)
            ),
        }

    def evict_windows(self, num_tokens: int) -> None:
        """Drop from each sliding group the pages its window no longer sees (sink pages stay)."""
        sink_pages = -(-self.num_sink_tokens // self.page_size)
        for table, w in zip(self.tables[1:], self.windows[1:], strict=True):
            if w is None:  # a second group without a window follows the policy with group 0
                continue
            first = max(num_tokens - w + 1, 0) // self.page_size
            table.evict_all_but([i for i in table.resident() if i < sink_pages or i >= first])

    def group_peaks(self) -> list[dict[str, Any]]:
        """Per group: name, window, layers, peak resident pages and their K/V bytes."""
        return [
            {
                "name": group_name(g),
                "window": w,
                "num_layers": len(g.layers),
                "peak_pages": t.peak,
                "peak_bytes": t.peak * self.page_layer_bytes * len(g.layers),
            }
            for g, w, t in zip(self.groups, self.windows, self.tables, strict=True)
        ]
