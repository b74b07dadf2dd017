"""StepJournal: what one ``Scheduler.schedule`` call reserved, so that the call either commits
as a whole or gives every reservation back."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedattn.cache import CacheManager
from pagedattn.engine.request_queues import RequestQueues
from pagedattn.engine.scheduled_batch import ScheduledSeq
from pagedattn.engine.sequence import Sequence, SequenceStatus
from pagedattn.engine.stats import SchedulerStats


@dataclass
class StepJournal:
    """The reservations of one schedule call, in the order they were made.

    Attributes:
        scheduled: each scheduled sequence's share of the step, its KV slots reserved.
        admitted: sequences moved from waiting to running by this call (an admitted sequence
            whose reservation raised is here and not in ``scheduled``).
    """

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)

    def commit(self, now: float, stats: SchedulerStats) -> None:
        """The whole batch was reserved: an admitted sequence scheduled for the first time
        records when, its prefix-cache hits and its prompt tokens."""
        for seq in self.admitted:
            if not seq.was_scheduled:
                seq.was_scheduled = True
                if seq.metrics.first_scheduled_time is None:  # shared by sibling children
                    seq.metrics.first_scheduled_time = now
                seq.num_cached_tokens = seq.num_computed_tokens
                stats.num_prompt_tokens += seq.num_prompt_tokens
                stats.prefix_cache_queries += seq.num_prompt_tokens
                stats.prefix_cache_hits += seq.num_computed_tokens

    def roll_back(self, cache: CacheManager, queues: RequestQueues) -> None:
        """Undo a schedule call that raised, newest reservation first: a running sequence
        gives back the slots it reserved, an admitted one its pages and its running place
        (it waits again at the front, nothing computed)."""
        for item in reversed(self.scheduled):
            if item.seq not in self.admitted:
                cache.unreserve(item.seq.seq_id, item.seq.num_computed_tokens)
        for seq in reversed(self.admitted):
            if seq.seq_id in cache:
                cache.free_sequence(seq.seq_id)
            if seq in queues.running:
                queues.running.remove(seq)
                queues.waiting.appendleft(seq)
            seq.status = SequenceStatus.WAITING
            seq.num_computed_tokens = 0
