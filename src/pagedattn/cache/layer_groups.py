"""Layer groups: the model's layers grouped by how much of the past their attention sees.

A hybrid model (Gemma 2 and 3, Cohere 2, gpt-oss) interleaves full-attention layers with
sliding-window layers. Each group of layers keeps its own page tables (vLLM's "KV cache
groups", ``vllm/v1/core/kv_cache_coordinator.py``): a full-attention group keeps every page of a
sequence, a sliding group only the pages its window can still see. Groups are ordered full
attention first, then by window, largest first; group 0 is the one the engine's own window
(``--sliding-window``) and sinks apply to unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerGroup:
    """Layers that share page tables.

    Attributes:
        window: the layers' sliding window W (a query at p sees keys p - W < j <= p), None
            for full attention.
        layers: the model's layer indices in the group, ascending.
    """

    window: int | None
    layers: tuple[int, ...]


def effective_window(engine_window: int | None, layer_window: int | None) -> int | None:
    """The window a layer with ``layer_window`` (None: full attention) attends with under the
    engine's own ``engine_window``: the smaller of the two that are set."""
    if layer_window is None or (engine_window is not None and engine_window <= layer_window):
        return engine_window
    return layer_window


def layer_groups(num_layers: int, layer_windows: tuple[int, ...] | None) -> tuple[LayerGroup, ...]:
    """The layer groups of a model whose layer ``i`` has window ``layer_windows[i]`` (0 or a
    None list: full attention): one group per distinct window, full attention first, then
    windows from the largest down.

    Raises:
        ValueError: ``num_layers`` < 1, a window list whose length is not ``num_layers``, or a
            negative window.
    """
    if num_layers < 1:
        raise ValueError(f"layer_groups: num_layers must be >= 1, got {num_layers}")
    windows = layer_windows or (0,) * num_layers
    if len(windows) != num_layers:
        raise ValueError(f"layer_groups: {len(windows)} layer windows for {num_layers} layers")
    if any(w < 0 for w in windows):
        raise ValueError(f"layer_groups: windows must be >= 0, got {sorted(set(windows))}")
    order = sorted(set(windows), key=lambda w: (w != 0, -w))
    return tuple(
        LayerGroup(w or None, tuple(i for i, lw in enumerate(windows) if lw == w)) for w in order
    )


def group_of_layers(groups: tuple[LayerGroup, ...], num_layers: int) -> tuple[int, ...]:
    """The group index of each layer.

    Raises:
        ValueError: the groups do not cover each layer of ``range(num_layers)`` exactly once.
    """
    out = [-1] * num_layers
    for g, group in enumerate(groups):
        for li in group.layers:
            if not 0 <= li < num_layers or out[li] != -1:
                raise ValueError(f"group_of_layers: layer {li} is out of range or in two groups")
            out[li] = g
    if -1 in out:
        raise ValueError(f"group_of_layers: layer {out.index(-1)} is in no group")
    return tuple(out)
