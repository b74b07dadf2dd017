"""A validated generation request: what the engine runs and how the answer is shaped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedattn.sampling_params import SamplingParams

if TYPE_CHECKING:  # the plan's module needs the HTTP errors; a Prepared does not
    from pagedattn.server.tools import ToolPlan


@dataclass(frozen=True)
class Prepared:
    """A validated request: prompt ids, sampling parameters, and how to answer.

    Attributes:
        echo_text: the text to put before each choice's text (completions ``echo``: the
            prompt's; chat ``echo``: the last message's content when it is the assistant's),
            else None.
        num_top: alternatives per token in the response's logprobs; None = no logprobs.
        tools: how a chat request calls tools (:mod:`pagedattn.server.tools`), else None.
        prompt_logprobs: alternatives per prompt token in the response's ``prompt_logprobs``
            (:mod:`pagedattn.server.prompt_logprobs`); None = not asked.
        token_ids: the response carries the prompt's and the choices' token ids (vLLM's
            ``return_token_ids``).
        tokens_as_ids: logprob tokens are spelled ``token_id:<id>`` (vLLM's
            ``return_tokens_as_token_ids``).
    """

    prompt_token_ids: list[int]
    params: SamplingParams
    echo_text: str | None = None
    num_top: int | None = None
    tools: ToolPlan | None = None
    prompt_logprobs: int | None = None
    token_ids: bool = False
    tokens_as_ids: bool = False
