"""Where a scheduler's requests are: waiting, running, live by request id, and the outputs of
requests that finished outside a step; retiring a finished sequence frees its pages once."""

from __future__ import annotations

import bisect
from collections import deque

from pagedattn.cache import CacheManager
from pagedattn.engine.kv_restores import KVRestores
from pagedattn.engine.outputs import FINISH_ERROR, RequestOutput
from pagedattn.engine.sequence import Sequence
from pagedattn.engine.stats import SchedulerStats


def may_admit(occupied: int, max_num_seqs: int) -> bool:
    """Whether a waiting sequence may start while ``occupied`` sequences run: one more must
    fit ``max_num_seqs``; into an empty batch it always may (progress)."""
    return occupied == 0 or occupied + 1 <= max_num_seqs


class RequestQueues:
    """The scheduler's queues and its live requests (one sequence each).

    Attributes:
        waiting: sequences to admit, front first (a preempted sequence goes back to the front).
        running: sequences holding pages, in arrival order (seq ids grow with arrival).
        requests: every waiting or running request's sequence by request id.
        pending: outputs of requests finished outside a step (rejections, aborts, failed
            steps), returned by the next ``take_pending``.
        restores: the sequences waiting for their KV from the persistent tier (in no queue
            meanwhile), None without a tier.

    Args:
        cache: the page tables; a retired running sequence's pages go back to it.
        stats: counts finished requests by finish reason.
        restores: see above.
    """

    def __init__(
        self, cache: CacheManager, stats: SchedulerStats, restores: KVRestores | None = None
    ) -> None:
        self.cache = cache
        self.stats = stats
        self.restores = restores
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}
        self.pending: list[RequestOutput] = []

    def insert_running(self, seq: Sequence) -> None:
        """Put ``seq`` in the running list at its arrival-order place: a resumed sequence is
        older than the requests admitted while it waited."""
        bisect.insort(self.running, seq, key=lambda s: s.seq_id)

    def retire(self, seq: Sequence) -> None:
        """Free a finished sequence and forget its request."""
        if seq in self.running:
            self.running.remove(seq)
            self.cache.free_sequence(seq.seq_id)
        else:
            self.remove_waiting(seq)
        if self.requests.get(seq.request_id) is seq:
            del self.requests[seq.request_id]
            assert seq.finish_reason is not None
            self.stats.num_finished[seq.finish_reason] += 1

    def remove_waiting(self, seq: Sequence) -> None:
        """Take a sequence that is not running out of the waiting queue, or cancel its
        restore (its records are dropped; it held no page)."""
        if self.restores is not None and self.restores.cancel(seq):
            return
        if seq in self.waiting:
            self.waiting.remove(seq)

    @property
    def num_waiting_for_kv(self) -> int:
        """Sequences whose restore from the persistent tier is in flight."""
        return 0 if self.restores is None else self.restores.num_waiting_for_kv

    def fail(self, seq: Sequence, error: str, now: float) -> None:
        """Finish an unfinished request with reason "error" and free it."""
        if not seq.is_finished:
            seq.finish(FINISH_ERROR, now, error=error)
            self.retire(seq)

    def finish_outside_step(self, seq: Sequence) -> None:
        """Count a request that finished before it was queued or while no step held it (a
        rejection, ``max_tokens == 0``, an abort) and keep its output for ``take_pending``."""
        assert seq.finish_reason is not None
        self.stats.num_finished[seq.finish_reason] += 1
        self.keep_output(seq)

    def keep_output(self, seq: Sequence) -> None:
        """Keep the request's latest delta, if any, for ``take_pending``."""
        out = seq.take_output()
        if out is not None:
            self.pending.append(out)

    def take_pending(self) -> list[RequestOutput]:
        """Outputs of requests finished outside a step (rejections, aborts, failed steps)."""
        outputs, self.pending = self.pending, []
        return outputs
