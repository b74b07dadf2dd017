"""StepOutput: what the model runner returns for one step, keyed by request id."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedattn.engine.logprobs import TokenLogprobs
from pagedattn.engine.spec.acceptance import AcceptedRun


@dataclass(frozen=True)
class RunTimings:
    """Seconds the model runner spent on one step, by phase.

    Attributes:
        build_s: building the ForwardBatch arrays from the plan.
        forward_s: the model forward (every layer, attention included).
        sample_s: logprobs, sampling and draft acceptance.
    """

    build_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0


@dataclass(frozen=True)
class SampledToken:
    """A request's token sampled this step.

    Attributes:
        token_id: the sampled id (-1 when ``error``).
        logprobs: its :class:`TokenLogprobs` when the request needs them, else None.
        error: why the row has no token (NaN logits, a logits processor raising...): that
            request fails alone; None when sampled.
        accepted: for a sequence that verified drafts, the tokens its drafts gain after
            ``token_id`` (:func:`pagedattn.engine.spec.acceptance.sample_run`); else None.
    """

    token_id: int
    logprobs: TokenLogprobs | None = None
    error: str | None = None
    accepted: AcceptedRun | None = None


@dataclass
class RequestStepOutput:
    """A request's share of a step's output.

    Attributes:
        sample: its sampled token; None when the step sampled none (a mid-prompt chunk).
        prompt_logprobs: (first position, logprobs) when its prompt logprobs were computed
            this step: entry ``j`` is the logprob of prompt token ``first + j``.
    """

    sample: SampledToken | None = None
    prompt_logprobs: tuple[int, list[TokenLogprobs]] | None = None


@dataclass(frozen=True)
class StepOutput:
    """The runner's output for a :class:`~pagedattn.engine.step_plan.StepPlan`.

    Attributes:
        requests: request id -> its share, for every request of the plan.
        timings: the runner's seconds by phase.
    """

    requests: dict[str, RequestStepOutput] = field(default_factory=dict)
    timings: RunTimings = field(default_factory=RunTimings)

    @property
    def num_sampled(self) -> int:
        """Tokens sampled from sample rows (accepted drafts not counted)."""
        return sum(r.sample is not None for r in self.requests.values())
