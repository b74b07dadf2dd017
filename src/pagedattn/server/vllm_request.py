"""vLLM's request fields beyond OpenAI's, declared on both generation routes.

Each is honoured, or accepted only with a value that changes nothing (vLLM's default, or any
value of a field that has no effect here) and otherwise refused with a 400 naming it
(:func:`pagedattn.server.vllm_fields.check_vllm_fields`). Honoured here (the routes read them):

- ``return_token_ids``: the prompt's and each choice's token ids in the response (vLLM's
  placement: on each completions choice; at the top of a chat response and its first chunk).
- ``return_tokens_as_token_ids``: logprob tokens spelled ``token_id:<id>``.
- ``truncate_prompt_tokens`` (``-1``: the model context less ``max_tokens``) with
  ``truncation_side`` (``left``, vLLM's default for generation, keeps the last tokens;
  ``right`` the first).
- ``allowed_token_ids``: only these tokens may be sampled.
- ``bad_words``: words never generated (vLLM's rule: the word's last token is banned where
  the tokens before it were just generated; spelled with and without a leading space).
- ``add_special_tokens``: the tokenizer's special tokens around the prompt (completions
  default true, chat false, as vLLM).
- ``request_id``: the response's ``id`` (after ``cmpl-`` / ``chatcmpl-``).
- ``documents`` (chat): reach the chat template as ``documents``.
"""

from __future__ import annotations

from typing import Any, Literal

from pagedattn.server.request_base import OpenAIRequest


class VLLMSamplingFields(OpenAIRequest):
    """vLLM's extra fields shared by completions and chat (see the module docstring)."""

    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    add_special_tokens: bool | None = None
    request_id: str | None = None
    # accepted only where they change nothing (NO_EFFECT)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    spaces_between_special_tokens: bool = True
    priority: int = 0
    prompt_embeds: Any = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    repetition_detection: dict[str, Any] | None = None


class VLLMChatFields(OpenAIRequest):
    """vLLM's extra chat fields."""

    documents: list[dict[str, str]] | None = None
    reasoning_effort: str | None = None
    thinking_token_budget: int | None = None
    include_reasoning: bool = True
    media_io_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
