"""StepReport: what one engine step did, returned with its outputs.

Observers (server metrics, the streaming CLI, the profiler) read the report of each
``LLMEngine.step()``; nothing has to be wrapped around the engine to see into a step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pagedattn.cache import CacheManager
from pagedattn.engine.outputs import RequestOutput
from pagedattn.engine.sequence import TextStream
from pagedattn.engine.stats import SchedulerStats
from pagedattn.engine.step_output import RunTimings
from pagedattn.engine.step_plan import StepPlan


@dataclass(frozen=True)
class StepTimings:
    """Seconds of one step, by phase (``perf_counter`` pairs).

    Attributes:
        schedule_s: scheduling (with copying the records of restores from the persistent
            tier into the pool; their reads run beside the steps).
        run: the model runner's phases.
        postprocess_s: applying the output (stop checks, detokenization included).
        detokenize_s: of ``postprocess_s``, incremental detokenization.
        total_s: the whole step.
    """

    schedule_s: float = 0.0
    run: RunTimings = field(default_factory=RunTimings)
    postprocess_s: float = 0.0
    detokenize_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class StepReport:
    """What one step did.

    Attributes:
        ran_model: True when a forward ran (False for a step with nothing scheduled).
        failed: True when the forward raised (the step's requests failed).
        num_seqs: sequences scheduled.
        num_scheduled_tokens: new tokens whose KV the forward computed (drafts not counted).
        num_draft_tokens: drafted tokens verified (speculative decoding).
        num_accepted_tokens: of those, drafts the samples confirmed.
        num_generated_tokens: tokens sampled and accepted this step.
        num_pages: the pool's pages.
        num_pages_used: pages referenced while the forward ran (after scheduling).
        kv_group_bytes: per layer group (``full``, ``sliding_W``), the bytes of K and V its
            referenced pages held while the forward ran.
        num_prefix_hit_tokens: prompt tokens served from the prefix cache at this step's
            first admissions.
        num_tier_restored_tokens: of those, tokens restored from the persistent tier.
        num_preemptions: sequences preempted by this step's scheduling.
        timings: its phases' seconds.
    """

    ran_model: bool = False
    failed: bool = False
    num_seqs: int = 0
    num_scheduled_tokens: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_generated_tokens: int = 0
    num_pages: int = 0
    num_pages_used: int = 0
    num_prefix_hit_tokens: int = 0
    num_tier_restored_tokens: int = 0
    num_preemptions: int = 0
    timings: StepTimings = field(default_factory=StepTimings)
    kv_group_bytes: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class StepCounters:
    """The engine counters a step report takes the difference of."""

    preemptions: int = 0
    prefix_hits: int = 0
    generated: int = 0
    accepted: int = 0
    tier_restored: int = 0

    @classmethod
    def of(cls, stats: SchedulerStats, cache: CacheManager) -> StepCounters:
        return cls(
            stats.num_preemptions,
            stats.prefix_cache_hits,
            stats.num_generation_tokens,
            stats.spec_num_accepted_tokens,
            cache.tier_restored_tokens,
        )

    def since(self, before: StepCounters) -> StepCounters:
        """What was counted between ``before`` and this snapshot."""
        return StepCounters(
            self.preemptions - before.preemptions,
            self.prefix_hits - before.prefix_hits,
            self.generated - before.generated,
            self.accepted - before.accepted,
            self.tier_restored - before.tier_restored,
        )


def step_report(
    plan: StepPlan,
    counted: StepCounters,
    num_pages: int,
    num_pages_used: int,
    timings: StepTimings,
    *,
    failed: bool,
) -> StepReport:
    """The report of a step that ran ``plan`` and counted ``counted``."""
    return StepReport(
        ran_model=bool(plan.requests),
        failed=failed,
        num_seqs=len(plan.requests),
        num_scheduled_tokens=plan.num_tokens,
        num_draft_tokens=plan.num_draft_tokens,
        num_accepted_tokens=counted.accepted,
        num_generated_tokens=counted.generated,
        num_pages=num_pages,
        num_pages_used=num_pages_used,
        num_prefix_hit_tokens=counted.prefix_hits,
        num_tier_restored_tokens=counted.tier_restored,
        num_preemptions=counted.preemptions,
        timings=timings,
    )


class StepResult(list[RequestOutput]):
    """The outputs of one step (a list of :class:`RequestOutput`, as before) and its
    :class:`StepReport` (``.report``)."""

    def __init__(self, outputs: list[RequestOutput], report: StepReport) -> None:
        super().__init__(outputs)
        self.report = report


class PhaseClock:
    """Seconds accumulated by the :class:`TimedTextStream` objects that share it."""

    def __init__(self) -> None:
        self.seconds = 0.0


class TimedTextStream:
    """A text stream (incremental detokenizer) whose calls add their time to a clock.

    Args:
        stream: the detokenizer (``add_token`` / ``flush``).
        clock: where its seconds go.
    """

    def __init__(self, stream: TextStream, clock: PhaseClock) -> None:
        self.stream = stream
        self.clock = clock

    def add_token(self, token_id: int) -> str:
        began = time.perf_counter()
        try:
            return self.stream.add_token(token_id)
        finally:
            self.clock.seconds += time.perf_counter() - began

    def flush(self) -> str:
        began = time.perf_counter()
        try:
            return self.stream.flush()
        finally:
            self.clock.seconds += time.perf_counter() - began
