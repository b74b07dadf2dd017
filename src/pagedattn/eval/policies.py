"""KV eviction policies acting on whole pages of one sequence's page table.

One small protocol (:class:`EvictionPolicy`): after each step the caller hands the policy the
logical indices of the resident pages (page ``i`` holds positions ``i * page_size ..``) and the
number of tokens written; the policy says which to keep so that the next token fits the budget.
An evicted page becomes an absent page-table entry (``-1``): the kernels skip it, nothing is
copied. The token-level mask (sliding window, sink tokens) the kernels apply inside the resident
pages is the policy's ``sliding_window`` / ``num_sink_tokens``.

Budget accounting, the same for every policy: ``resident pages x page_size <= budget`` at every
step, sink pages included, so a budget of ``n`` pages holds at most ``n`` pages while a token is
attended. Policies:

* ``full``: no eviction (the reference; no budget).
* ``window``: the most recent ``W = (n - 1) * page_size + 1`` tokens, token-exact (the kernels'
  sliding-window mask); ``W`` is the largest window whose pages always fit ``n`` pages.
* ``sinks``: the first ``S`` tokens (StreamingLLM attention sinks, Xiao et al. 2023, arXiv
  2309.17453; ``S = 4``) on their own pages plus a window on the remaining pages.
* ``h2o``: Heavy-Hitter Oracle (Zhang et al. 2023, arXiv 2306.14048) on pages: the most recent
  ``ceil(n / 2)`` pages plus the older pages with the largest accumulated attention mass
  (:func:`pagedattn.kernels.attention_mass.page_attention_mass`).
* ``random``: keeps a seeded random choice of pages (a floor).

``window`` and ``sinks`` may run in ``absolute`` or ``shifted`` positions (StreamingLLM); ``h2o``
and ``random`` keep scattered pages, whose in-cache positions would need re-rotated keys, so they
run in ``absolute`` positions only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

POLICIES = ("full", "window", "sinks", "h2o", "random")
DEFAULT_SINKS = 4


class EvictionPolicy(Protocol):
    """What the perplexity lab (and, later, serving) asks of a policy."""

    name: str
    position_mode: str
    needs_attention: bool  # True: ``keep`` reads per-page attention mass (decode steps only)

    @property
    def max_pages(self) -> int | None:
        """Pages the sequence may hold (budget // page_size); None = unbounded."""

    @property
    def sliding_window(self) -> int | None:
        """Token-exact window W the kernels mask with, or None."""

    @property
    def num_sink_tokens(self) -> int:
        """Sink tokens S the kernels keep visible."""

    def keep(
        self, resident: Sequence[int], num_tokens: int, page_mass: np.ndarray | None
    ) -> list[int]:
        """Logical page indices (a subset of ``resident``, ascending) to keep after
        ``num_tokens`` tokens were written, so that token ``num_tokens`` fits the budget.

        Args:
            resident: ascending logical indices of the resident pages.
            num_tokens: tokens written so far (the next token's position).
            page_mass: float ``(>= max(resident) + 1,)`` accumulated attention mass per logical
                page (``needs_attention`` policies), else None.
        """


def _capacity(max_pages: int, page_size: int, num_tokens: int) -> int:
    """Pages that may stay resident before the next token: one fewer when it opens a page."""
    return max_pages - (1 if num_tokens % page_size == 0 else 0)


@dataclass
class FullPolicy:
    """No eviction: every page stays resident (the reference)."""

    page_size: int
    name: str = "full"
    position_mode: str = "absolute"
    max_pages: int | None = None
    needs_attention: bool = False
    sliding_window: int | None = None
    num_sink_tokens: int = 0

    def keep(
        self, resident: Sequence[int], num_tokens: int, page_mass: np.ndarray | None
    ) -> list[int]:
        return list(resident)


@dataclass
class WindowPolicy:
    """Window (``num_sinks = 0``) or sinks + window, token-exact, within ``max_pages`` pages."""

    page_size: int
    max_pages: int
    num_sinks: int = 0
    position_mode: str = "absolute"
    needs_attention: bool = False
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = "sinks" if self.num_sinks else "window"
        if self.max_pages - self.sink_pages < 1:
            raise ValueError(
                f"budget: {self.name} needs at least {self.sink_pages + 1} pages of "
                f"{self.page_size} tokens, got {self.max_pages}"
            )

    @property
    def sink_pages(self) -> int:
        return -(-self.num_sinks // self.page_size)

    @property
    def sliding_window(self) -> int:
        return (self.max_pages - self.sink_pages - 1) * self.page_size + 1

    @property
    def num_sink_tokens(self) -> int:
        return self.num_sinks

    def keep(
        self, resident: Sequence[int], num_tokens: int, page_mass: np.ndarray | None
    ) -> list[int]:
        first = max(num_tokens - self.sliding_window + 1, 0) // self.page_size
        return [i for i in resident if i < self.sink_pages or i >= first]


@dataclass
class H2OPolicy:
    """Recent pages plus heavy hitters by accumulated attention mass (H2O on pages)."""

    page_size: int
    max_pages: int
    name: str = "h2o"
    position_mode: str = "absolute"
    needs_attention: bool = True
    sliding_window: int | None = None
    num_sink_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_pages < 2:
            raise ValueError(f"budget: h2o needs at least 2 pages, got {self.max_pages}")

    @property
    def recent_pages(self) -> int:
        return -(-self.max_pages // 2)

    def keep(
        self, resident: Sequence[int], num_tokens: int, page_mass: np.ndarray | None
    ) -> list[int]:
        cap = _capacity(self.max_pages, self.page_size, num_tokens)
        if len(resident) <= cap:
            return list(resident)
        if page_mass is None:
            raise ValueError("h2o: expected page_mass (accumulated attention per page), got None")
        # The page being filled counts as recent; when the next token opens a page, it is one.
        recent = self.recent_pages - (1 if num_tokens % self.page_size == 0 else 0)
        recent_set = list(resident[len(resident) - recent :]) if recent > 0 else []
        older = list(resident[: len(resident) - recent]) if recent > 0 else list(resident)
        heavy = sorted(older, key=lambda i: (-float(page_mass[i]), -i))[: cap - len(recent_set)]
        return sorted(heavy + recent_set)


@dataclass
class RandomPolicy:
    """A seeded random choice of resident pages (the floor)."""

    page_size: int
    max_pages: int
    seed: int = 0
    name: str = "random"
    position_mode: str = "absolute"
    needs_attention: bool = False
    sliding_window: int | None = None
    num_sink_tokens: int = 0
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_pages < 2:
            raise ValueError(f"budget: random needs at least 2 pages, got {self.max_pages}")
        self.rng = np.random.default_rng(self.seed)

    def keep(
        self, resident: Sequence[int], num_tokens: int, page_mass: np.ndarray | None
    ) -> list[int]:
        cap = _capacity(self.max_pages, self.page_size, num_tokens)
        if len(resident) <= cap:
            return list(resident)
        chosen = self.rng.choice(len(resident), size=cap, replace=False)
        return sorted(resident[int(i)] for i in chosen)


def make_policy(
    name: str,
    *,
    page_size: int,
    budget: int | None,
    position_mode: str = "absolute",
    num_sinks: int = DEFAULT_SINKS,
    seed: int = 0,
) -> EvictionPolicy:
    """Build a policy by name.

    Args:
        name: one of :data:`POLICIES`.
        page_size: tokens per page.
        budget: KV tokens the sequence may hold (``budget // page_size`` pages); ignored by
            ``full``.
        position_mode: ``absolute`` or ``shifted`` (``window`` / ``sinks`` / ``full`` only).
        num_sinks: sink tokens of ``sinks``.
        seed: seed of ``random``.

    Raises:
        ValueError: an unknown name or position mode, a budget below the policy's minimum, or
            ``shifted`` with ``h2o`` / ``random``.
    """
    if name not in POLICIES:
        raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {name!r}")
    if position_mode not in ("absolute", "shifted"):
        raise ValueError(f"position_mode: expected 'absolute' or 'shifted', got {position_mode!r}")
    if name == "full":
        return FullPolicy(page_size, position_mode=position_mode)
    if budget is None or budget < 1:
        raise ValueError(f"budget: policy {name!r} needs a budget >= 1 token, got {budget}")
    pages = budget // page_size
    if name in ("window", "sinks"):
        sinks = num_sinks if name == "sinks" else 0
        if name == "sinks" and sinks < 1:
            raise ValueError(f"sinks: expected >= 1 sink token, got {num_sinks}")
        return WindowPolicy(page_size, pages, sinks, position_mode=position_mode)
    if position_mode != "absolute":
        raise ValueError(
            f"position_mode: {name!r} keeps scattered pages and runs in 'absolute' positions only"
        )
    if name == "h2o":
        return H2OPolicy(page_size, pages)
    return RandomPolicy(page_size, pages, seed)
