"""The page grid of ``/v1/kv/state``: page states as run-length encoded cells, at most
``max_cells`` of them (several pages per cell past that)."""

from __future__ import annotations

import itertools
from typing import Literal, cast

import numpy as np

from pagedattn.cache.pool_snapshot import PAGE_STATES
from pagedattn.server.kv_state_models import STATE_LETTERS

Letter = Literal["f", "c", "u", "s"]
_LETTERS = [cast(Letter, STATE_LETTERS[name]) for name in PAGE_STATES]


def page_cells(states: bytes, max_cells: int) -> tuple[int, int, list[tuple[Letter, int]]]:
    """``(pages_per_cell, num_cells, runs)`` for one code per page (:data:`PAGE_STATES`).

    A cell of several pages takes the state most of its pages are in; a tie goes to the
    higher code (the busier state: shared > used > cached > free). The last cell may cover
    fewer pages.

    Raises:
        ValueError: ``max_cells`` < 1.
    """
    if max_cells < 1:
        raise ValueError(f"max_cells must be >= 1, got {max_cells}")
    codes = np.frombuffer(states, np.uint8)
    per_cell = max(1, -(-len(codes) // max_cells))
    if per_cell > 1:
        num_cells = -(-len(codes) // per_cell)
        padded = np.full(num_cells * per_cell, 255, np.uint8)  # 255: counts for no state
        padded[: len(codes)] = codes
        grid = padded.reshape(num_cells, per_cell)
        counts = np.stack([(grid == c).sum(axis=1) for c in range(len(PAGE_STATES))], axis=1)
        # argmax takes the first maximum: over reversed codes that is the highest code
        codes = (len(PAGE_STATES) - 1 - np.argmax(counts[:, ::-1], axis=1)).astype(np.uint8)
    if not len(codes):
        return per_cell, 0, []
    starts = np.flatnonzero(np.diff(codes)) + 1
    bounds = [0, *starts.tolist(), len(codes)]
    runs = [(_LETTERS[int(codes[a])], b - a) for a, b in itertools.pairwise(bounds)]
    return per_cell, len(codes), runs
