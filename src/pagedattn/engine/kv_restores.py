"""Requests "waiting for KV": persistent-tier restores that run beside the engine's steps.

When a waiting request reaches the head of the waiting queue and the tier may hold pages of its
prefix that the pool lacks, the scheduler starts a restore (:meth:`KVRestores.begin`): the
records to read are planned on the engine thread (:func:`pagedattn.cache.fetch_plan.plan_fetch`,
no I/O) and read on one restore thread (:meth:`pagedattn.cache.tier_fetch.TierFetch.run`: the
store's I/O, record checks, checksums and signatures). The request leaves the waiting queue
(status ``WAITING_FOR_KV``, vLLM's ``WAITING_FOR_REMOTE_KVS``) and the steps go on without it.

Each later ``schedule()`` polls without waiting (:meth:`KVRestores.poll`): a restore whose
reads ended, or whose deadline (``kv_store_deadline_s`` after it started) passed, returns its
request to the front of the waiting queue with the records read so far. Its admission then
copies them into the pool exactly as a synchronous restore does
(``CacheManager.add_sequence(..., fetched=...)``) and counts the tokens as cached and
tier-restored. A deadline that passed is counted on the tier (``lookups_timed_out``,
``lookup_pages_dropped``, ``errors["deadline"]``) and a store that raised in
``tier_errors["lookup"]``; the request computes what was not read. While a read given up at
its deadline is still on the store, a new restore is a miss at once (``lookups_skipped``).

A request whose records a read in flight already covers (a burst of requests sharing a prefix)
waits on that read instead of starting its own. Bounds: at most ``max_in_flight`` reads are
queued or running on the one restore thread (the head of the waiting queue waits for a free
one, at most a deadline); records are kept only for requests between their restore and their
admission. An abort (:meth:`KVRestores.cancel`) abandons the read (unless another request
waits on it) and drops its records; no page was taken before admission.
"""

from __future__ import annotations

import concurrent.futures
import enum
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pagedattn.cache import CacheManager
from pagedattn.cache.fetch_plan import plan_fetch
from pagedattn.cache.tier_fetch import NO_PAGES, FetchedPages, TierFetch
from pagedattn.engine.sequence import Sequence

if TYPE_CHECKING:
    from pagedattn.storage import KVTier

logger = logging.getLogger("pagedattn.engine")
_ENGINES = itertools.count()

#: Reads queued or running on the restore thread at once.
MAX_IN_FLIGHT = 4
#: The longest one step of an engine with nothing else to run waits for a restore (it then
#: returns, so that new requests are not kept waiting).
IDLE_WAIT_S = 0.02


class Begin(enum.Enum):
    """What :meth:`KVRestores.begin` did with the head of the waiting queue."""

    ADMIT = "admit"  # nothing to read (or read already): admit it now
    STARTED = "started"  # its restore runs: it waits for its KV
    BUSY = "busy"  # the restore thread is full: it stays first in the queue


@dataclass
class _Restore:
    seq: Sequence
    fetch: TierFetch
    deadline: float


class KVRestores:
    """The engine's restores in flight and the records read for requests not yet admitted.

    Args:
        cache: the page tables (the pool the plans look at).
        tier: the persistent tier (group 0's with layer groups), where deadlines are counted.
        deadline_s: the most seconds a restore may take (> 0).
        errors: where a store that raised is counted (``"lookup"``): the cache's
            ``tier_errors``.
        max_in_flight: reads queued or running at once (>= 1).
        clock: monotonic seconds (tests may pass a fake one).
    """

    def __init__(
        self,
        cache: CacheManager,
        tier: KVTier,
        deadline_s: float,
        errors: Counter[str],
        *,
        max_in_flight: int = MAX_IN_FLIGHT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not deadline_s > 0 or max_in_flight < 1:
            raise ValueError(f"KVRestores: deadline_s {deadline_s!r}, in flight {max_in_flight}")
        self.cache = cache
        self.tier = tier
        self.deadline_s = deadline_s
        self.errors = errors
        self.max_in_flight = max_in_flight
        self._clock = clock
        #: the restore thread's name (one per engine)
        self.thread_name = f"kv-restore-{next(_ENGINES)}"
        self._thread = concurrent.futures.ThreadPoolExecutor(1, self.thread_name)
        self._futures: list[concurrent.futures.Future[None]] = []
        self._restoring: dict[int, _Restore] = {}  # by seq id, in start order
        self._ready: dict[int, FetchedPages] = {}
        self._overrun: TierFetch | None = None  # given up at its deadline, maybe still reading
        self._wake = threading.Event()
        self._closed = False

    @property
    def num_waiting_for_kv(self) -> int:
        """Requests whose restore is in flight."""
        return len(self._restoring)

    def begin(self, seq: Sequence, tokens: SequenceABC[int]) -> Begin:
        """Start the restore of the first waiting sequence's prefix when the tier may hold
        pages of it that the pool lacks (``tokens``: what its admission looks up)."""
        if seq.seq_id in self._ready or self._closed:
            return Begin.ADMIT
        fetch = plan_fetch(self.cache, np.asarray(tokens, dtype=np.int64))
        if fetch is None:
            return Begin.ADMIT
        if self._overrun is not None and not self._overrun.done.is_set():
            self.tier.count_deadline(skipped=True, pages_dropped=fetch.num_asked)
            return Begin.ADMIT
        shared = next((r for r in self._restoring.values() if r.fetch.covers(fetch)), None)
        if shared is not None:  # a read in flight holds every record it needs: wait for it
            self._restoring[seq.seq_id] = _Restore(seq, shared.fetch, shared.deadline)
            return Begin.STARTED
        self._futures = [f for f in self._futures if not f.done()]
        if len(self._futures) >= self.max_in_flight:
            return Begin.BUSY
        self._futures.append(self._thread.submit(self._read, fetch))
        self._restoring[seq.seq_id] = _Restore(seq, fetch, self._clock() + self.deadline_s)
        return Begin.STARTED

    def _read(self, fetch: TierFetch) -> None:
        """On the restore thread."""
        try:
            fetch.run()
        finally:
            self._wake.set()

    def poll(self) -> list[Sequence]:
        """The sequences whose restore ended (read, failed, or past its deadline), in start
        order; their records wait for their admission (:meth:`records`). Never waits."""
        now, out = self._clock(), []
        for seq_id, r in list(self._restoring.items()):
            fetch = r.fetch
            if fetch.done.is_set():
                if fetch.error is not None:
                    self.errors["lookup"] += 1
                    logger.warning("kv_store restore failed: a prefix-cache miss",
                                   exc_info=fetch.error)  # fmt: skip
            elif now >= r.deadline:
                fetch.abandon()
                self._overrun = fetch
                dropped = fetch.num_asked - fetch.num_fetched()
                self.tier.count_deadline(skipped=False, pages_dropped=dropped)
            else:
                continue
            del self._restoring[seq_id]
            self._ready[seq_id] = fetch.result()
            out.append(r.seq)
        return out

    def records(self, seq: Sequence) -> FetchedPages:
        """The records read for ``seq`` (:data:`NO_PAGES` when none were)."""
        return self._ready.get(seq.seq_id, NO_PAGES)

    def admitted(self, seq: Sequence) -> None:
        """``seq`` was admitted: its records are in the pool or no longer needed."""
        self._ready.pop(seq.seq_id, None)

    def cancel(self, seq: Sequence) -> bool:
        """Forget ``seq``'s restore (an abort): its read is abandoned, its records dropped.

        Returns:
            True when its restore was in flight (it is in no queue then).
        """
        self._ready.pop(seq.seq_id, None)
        r = self._restoring.pop(seq.seq_id, None)
        if r is None:
            return False
        if all(other.fetch is not r.fetch for other in self._restoring.values()):
            r.fetch.abandon()  # no other request waits on this read
        return True

    def idle_wait(self, max_s: float = IDLE_WAIT_S) -> None:
        """Wait until a restore ends, its deadline or ``max_s``, whichever comes first (the
        engine had nothing else to run this step)."""
        if not self._restoring:
            return
        self._wake.clear()
        if any(r.fetch.done.is_set() for r in self._restoring.values()):
            return
        soonest = min(r.deadline for r in self._restoring.values()) - self._clock()
        self._wake.wait(max(0.0, min(max_s, soonest)))

    def close(self) -> None:
        """Abandon every read and stop the restore thread without waiting for a stalled store
        (idempotent)."""
        self._closed = True
        for r in self._restoring.values():
            r.fetch.abandon()
        self._thread.shutdown(wait=False, cancel_futures=True)
