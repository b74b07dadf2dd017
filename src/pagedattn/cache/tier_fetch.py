"""A persistent-tier restore in three halves, so that the engine thread never waits on a store:

1. :func:`pagedattn.cache.fetch_plan.plan_fetch` (engine thread, no I/O): which records a
   prompt's prefix hit could use, per layer group: group 0's pages after its in-memory chain,
   and for each sliding group the pages a hit needs that its pool does not hold (known once
   group 0's run is read).
2. :meth:`TierFetch.run` (a restore thread): reads them with each group's tier
   (:meth:`pagedattn.storage.KVTier.fetch`: store I/O, record checks, checksums, signatures),
   until done or :meth:`TierFetch.abandon`.
3. ``CacheManager.add_sequence(..., fetched=...)`` (engine thread): the same restore as a
   synchronous one (:func:`pagedattn.cache.tier_pages.restore_pages`,
   :mod:`pagedattn.cache.hybrid_tier`), each group reading its records from
   :class:`FetchedPages` instead of the store: allocate, copy into the pool, register in the
   prefix index, roll back on failure. The pool may have changed since the plan; records the
   hit no longer needs are ignored, pages it needs and the fetch lacks are a miss.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from pagedattn.cache.hashing import PageHash, PageKey
from pagedattn.cache.hybrid_hits import visible_pages
from pagedattn.cache.tier_pages import PageTier


class FetchJob:
    """What one read of consecutive records fetched so far; the reading thread appends to
    ``pages`` until the run ends or ``abandoned`` is set (both under ``lock``)."""

    def __init__(self, keys: Sequence[PageKey]) -> None:
        self.keys = keys
        self.lock = threading.Lock()
        self.pages: list[np.ndarray] = []
        self.abandoned = False

    def taken(self) -> dict[PageHash, np.ndarray]:
        """The pages fetched so far by their hash."""
        with self.lock:
            return {k.page_hash: kv for k, kv in zip(self.keys, self.pages, strict=False)}


@runtime_checkable
class FetchingTier(PageTier, Protocol):
    """A tier that can read records on the calling thread (:class:`pagedattn.storage.KVTier`)."""

    def fetch(self, job: FetchJob) -> None:
        """The consecutive run of stored, valid pages of ``job.keys`` into ``job.pages``."""
        ...


class FetchedTier:
    """A :class:`PageTier` whose lookups read fetched records (no I/O); loads and writes go to
    the real tier."""

    def __init__(self, tier: PageTier, pages: dict[PageHash, np.ndarray]) -> None:
        self.tier = tier
        self.pages = pages

    def lookup(self, keys: Sequence[PageKey]) -> list[np.ndarray]:
        """The fetched KV of the longest prefix of ``keys`` (records were checked when read)."""
        out: list[np.ndarray] = []
        for key in keys:
            kv = self.pages.get(key.page_hash)
            if kv is None:
                break
            out.append(kv)
        return out

    def load(self, page_id: int, kv: np.ndarray) -> None:
        self.tier.load(page_id, kv)

    def write(self, page_ids: Sequence[int], keys: Sequence[PageKey]) -> None:
        self.tier.write(page_ids, keys)


@dataclass(frozen=True)
class FetchedPages:
    """One restore's records per layer group (page hash -> KV)."""

    groups: tuple[dict[PageHash, np.ndarray], ...] = ()

    def tier(self, group: int, tier: PageTier | None) -> PageTier | None:
        """Group ``group``'s tier for ``add_sequence``: its fetched records (none when the
        group fetched nothing), loading into the pool through ``tier``."""
        if tier is None:
            return None
        return FetchedTier(tier, self.groups[group] if group < len(self.groups) else {})


#: No records: an admission that reads nothing from the tier (a miss, or nothing to restore).
NO_PAGES = FetchedPages()


@dataclass(frozen=True)
class WindowFetch:
    """What a sliding group's read needs: its tier, page keys, pages its pool held at the
    plan, window and sink pages."""

    tier: FetchingTier
    keys: tuple[PageKey, ...]
    present: tuple[bool, ...]
    window: int | None
    num_sink_pages: int


class TierFetch:
    """The records one prompt's restore reads (see the module doc): built by
    :func:`~pagedattn.cache.fetch_plan.plan_fetch`, run once on a restore thread, read by the
    engine thread.

    Attributes:
        first: group 0's first page to read (its in-memory chain's length at the plan).
        num_asked: group 0's pages asked for.
        error: what the store raised, None when nothing did.
    """

    def __init__(
        self, tier: FetchingTier, keys: Sequence[PageKey], first: int, page_size: int,
        windows: Sequence[WindowFetch],
    ) -> None:  # fmt: skip
        self.first = first
        self.page_size = page_size
        self.num_asked = len(keys)
        self.error: BaseException | None = None
        self._tier = tier
        self._windows = tuple(windows)
        self._jobs = {0: FetchJob(keys)}  # by layer group
        self._lock = threading.Lock()
        self._abandoned = False
        self.done = threading.Event()

    def covers(self, other: TierFetch) -> bool:
        """Whether this read fetches every record ``other`` would (the same start and group 0
        keys, or a prefix of them; the same keys when sliding groups read a window, which
        depends on where group 0's run ends)."""
        mine, theirs = self._jobs[0].keys, other._jobs[0].keys
        if self.first != other.first or len(theirs) > len(mine):
            return False
        if self._windows or other._windows:
            return list(mine) == list(theirs) and not self._abandoned
        return list(mine[: len(theirs)]) == list(theirs) and not self._abandoned

    def run(self) -> None:
        """Read the records (restore thread); ``done`` is set at the end whatever happened."""
        try:
            self._run()
        except Exception as exc:  # a store that raises: a miss for what was not read
            self.error = exc
        finally:
            self.done.set()

    def _run(self) -> None:
        with self._lock:
            if self._abandoned:
                return
        self._tier.fetch(self._jobs[0])
        top = self.first + len(self._jobs[0].pages)
        if top == self.first:
            return
        ps = self.page_size
        for g, w in enumerate(self._windows, start=1):
            indices = [*range(min(w.num_sink_pages, top)),
                       *visible_pages(top, w.window, w.num_sink_pages, ps)]  # fmt: skip
            need = [w.keys[i] for i in indices if not w.present[i]]
            if not need:
                continue
            job = FetchJob(need)
            with self._lock:
                if self._abandoned:
                    return
                self._jobs[g] = job
            w.tier.fetch(job)
            if len(job.pages) < len(need):
                return  # the hit cannot reach ``top``: the rest of the groups are not read

    def abandon(self) -> None:
        """Stop reading (the deadline, or the request ended); what was read stays readable."""
        with self._lock:
            self._abandoned = True
            for job in self._jobs.values():
                with job.lock:
                    job.abandoned = True

    def num_fetched(self) -> int:
        """Group 0's pages read so far."""
        with self._jobs[0].lock:
            return len(self._jobs[0].pages)

    def result(self) -> FetchedPages:
        """The records read so far, per group."""
        with self._lock:
            jobs = dict(self._jobs)
        groups = range(1 + len(self._windows))
        return FetchedPages(tuple(jobs[g].taken() if g in jobs else {} for g in groups))
