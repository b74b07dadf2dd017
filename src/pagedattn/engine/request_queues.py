"""Where a scheduler's requests are: waiting, running, live by request id, and the outputs of
requests that finished outside a step; retiring a finished sequence frees its pages once."""

from __future__ import annotations

import bisect
from collections import deque

from pagedattn.cache import CacheManager
from pagedattn.engine.kv_restores import KVRestores
from pagedattn.engine.outputs import FINISH_ERROR, RequestOutput
from pagedattn.engine.sequence import Sequence
from pagedattn.engine.sequence_group import SequenceGroup
from pagedattn.engine.stats import SchedulerStats


def seats(seq: Sequence) -> int:
    """Running places ``seq`` takes once admitted: itself and the children it forks after its
    prefill (``n`` / ``best_of`` > 1)."""
    return 1 + len(seq.fork_children)


def may_admit(occupied: int, seq: Sequence, max_num_seqs: int) -> bool:
    """Whether the first waiting sequence may start while ``occupied`` seats are taken (the
    :func:`seats` of every running sequence, forks not made yet included): all its seats must
    fit ``max_num_seqs`` (a request of ``n`` choices is counted whole, so that its forks never
    push the batch past the limit); into an empty batch it always may (progress)."""
    return occupied == 0 or occupied + seats(seq) <= max_num_seqs


class RequestQueues:
    """The scheduler's queues and its live requests.

    Attributes:
        waiting: sequences to admit, front first (a preempted sequence goes back to the front).
        running: sequences holding pages, in arrival order (seq ids grow with arrival).
        requests: every waiting or running request by request id.
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
        self.requests: dict[str, SequenceGroup] = {}
        self.pending: list[RequestOutput] = []

    def insert_running(self, seq: Sequence) -> None:
        """Put ``seq`` in the running list at its arrival-order place: a resumed or forked
        sequence is older than the requests admitted while it waited."""
        bisect.insort(self.running, seq, key=lambda s: s.seq_id)

    def retire(self, seq: Sequence, group: SequenceGroup) -> None:
        """Free a finished sequence; forget its request once every sequence finished."""
        if seq in self.running:
            self.running.remove(seq)
            self.cache.free_sequence(seq.seq_id)
        else:
            self.remove_waiting(seq)
        if group.is_finished:
            del self.requests[seq.request_id]
            assert group.parent.finish_reason is not None
            self.stats.num_finished[group.parent.finish_reason] += 1

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

    def fail_group(self, group: SequenceGroup, error: str, now: float) -> None:
        """Finish every unfinished sequence of a request with reason "error" and free it."""
        group.finish_unforked(FINISH_ERROR, now, error=error)
        for seq in group.seqs:
            if not seq.is_finished:
                seq.finish(FINISH_ERROR, now, error=error)
                self.retire(seq, group)

    def finish_outside_step(self, group: SequenceGroup) -> None:
        """Count a request that finished before it was queued or while no step held it (a
        rejection, ``max_tokens == 0``, an abort) and keep its output for ``take_pending``."""
        reason = group.parent.finish_reason
        assert reason is not None
        self.stats.num_finished[reason] += 1
        self.keep_output(group)

    def keep_output(self, group: SequenceGroup) -> None:
        """Keep the request's latest delta, if any, for ``take_pending``."""
        out = group.take_output()
        if out is not None:
            self.pending.append(out)

    def take_pending(self) -> list[RequestOutput]:
        """Outputs of requests finished outside a step (rejections, aborts, failed steps)."""
        outputs, self.pending = self.pending, []
        return outputs
