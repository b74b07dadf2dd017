"""OpenAI-compatible request models (pydantic v2); the response bodies are in
:mod:`pagedattn.server.reply_models` and named here too.

Field names and meanings follow the OpenAI API reference for ``/v1/completions`` and
``/v1/chat/completions`` (and vLLM's ``entrypoints/openai/protocol.py`` for the extensions
``top_k``, ``ignore_eos``, ``guided_*``, ``chat_template``...). Request models derive from
:class:`pagedattn.server.request_base.OpenAIRequest`: strict types, finite numbers, no lone
surrogates, each violation a 400 naming the field (see :mod:`pagedattn.server.errors`). An
unknown top-level field is kept in ``model_extra`` and refused with a 400 naming it
(:mod:`pagedattn.server.request_fields`), as OpenAI does. Ranges (temperature >= 0, top_p in
(0, 1], ...) are checked once, by :class:`pagedattn.sampling_params.SamplingParams`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import Field

# The response bodies: defined in reply_models, named here too (p.Completion, ...).
from pagedattn.server.reply_models import (
    AssistantMessage as AssistantMessage,
)
from pagedattn.server.reply_models import (
    ChatChoice as ChatChoice,
)
from pagedattn.server.reply_models import (
    ChatChunkChoice as ChatChunkChoice,
)
from pagedattn.server.reply_models import (
    ChatCompletion as ChatCompletion,
)
from pagedattn.server.reply_models import (
    ChatCompletionChunk as ChatCompletionChunk,
)
from pagedattn.server.reply_models import (
    ChatDelta as ChatDelta,
)
from pagedattn.server.reply_models import (
    ChatLogprobs as ChatLogprobs,
)
from pagedattn.server.reply_models import (
    ChatTokenLogprob as ChatTokenLogprob,
)
from pagedattn.server.reply_models import (
    Completion as Completion,
)
from pagedattn.server.reply_models import (
    CompletionChoice as CompletionChoice,
)
from pagedattn.server.reply_models import (
    CompletionLogprobs as CompletionLogprobs,
)
from pagedattn.server.reply_models import (
    ErrorBody as ErrorBody,
)
from pagedattn.server.reply_models import (
    ErrorResponse as ErrorResponse,
)
from pagedattn.server.reply_models import (
    FinishReason as FinishReason,
)
from pagedattn.server.reply_models import (
    FunctionCall as FunctionCall,
)
from pagedattn.server.reply_models import (
    ModelCard as ModelCard,
)
from pagedattn.server.reply_models import (
    ModelList as ModelList,
)
from pagedattn.server.reply_models import (
    PromptTokensDetails as PromptTokensDetails,
)
from pagedattn.server.reply_models import (
    ToolCall as ToolCall,
)
from pagedattn.server.reply_models import (
    ToolCallDelta as ToolCallDelta,
)
from pagedattn.server.reply_models import (
    TopLogprob as TopLogprob,
)
from pagedattn.server.reply_models import (
    Usage as Usage,
)
from pagedattn.server.reply_models import (
    dump as dump,
)
from pagedattn.server.reply_models import (
    make_usage as make_usage,
)
from pagedattn.server.request_base import OpenAIRequest
from pagedattn.server.structured_outputs import StructuredOutputs
from pagedattn.server.vllm_request import VLLMChatFields, VLLMSamplingFields


def random_id(prefix: str) -> str:
    """``prefix`` + 24 hex chars of a fresh uuid4 (e.g. ``chatcmpl-...``)."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now_s() -> int:
    """Unix time in whole seconds (the ``created`` field)."""
    return int(time.time())


class JsonSchemaFormat(OpenAIRequest):
    """``response_format.json_schema``: ``schema`` is the JSON schema the output must match."""

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIRequest):
    """OpenAI ``response_format``: ``text`` (no constraint), ``json_object`` (any JSON object)
    or ``json_schema`` (the given schema); vLLM's ``structural_tag`` (``structures`` and
    ``triggers``, kept in ``model_extra``: :mod:`pagedattn.server.structural_tag`)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(OpenAIRequest):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` and no choices;
    with it, vLLM's ``continuous_usage_stats`` puts the usage so far on every chunk."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(VLLMSamplingFields):
    """Fields shared by both generation endpoints (OpenAI's, plus vLLM's sampling extensions
    ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``stop_token_ids``,
    ``include_stop_str_in_output``, ``skip_special_tokens``, ``ignore_eos``, and those of
    :mod:`pagedattn.server.vllm_request`).

    ``max_tokens`` (or ``max_completion_tokens``, which wins when both are set) must be >= 1
    (0 is allowed with completions' ``echo``); None = as many as the model context and the KV
    pool allow (completions: 16, as OpenAI). ``logit_bias`` keys are token ids (JSON strings).
    """

    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict[str, float] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # structured output (server/structured.py): OpenAI's, then vLLM's guided decoding fields
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None
    structured_outputs: StructuredOutputs | None = None
    # the prompt's own logprobs (vLLM's format; server/prompt_logprobs.py); -1 = the vocabulary
    prompt_logprobs: int | None = None
    # false: never draft tokens for this request (speculation never changes the output)
    speculative: bool = True
    # informational: accepted, never change the output
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: ``prompt`` is text, token ids, or a one-element list of
    either (several prompts in one request are refused with a 400)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class TextPart(OpenAIRequest):
    """One ``{"type": "text", "text": ...}`` part of a message's content."""

    type: Literal["text"] = "text"
    text: str


class ChatMessage(OpenAIRequest):
    """One message; content as a string or a list of text parts (joined). Other fields
    (``tool_calls``, ``tool_call_id``...) reach the chat template as they are, and so does any
    role (the template decides what it accepts, as in vLLM)."""

    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message text (parts joined with no separator, None as "")."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields, VLLMChatFields):
    """``POST /v1/chat/completions``: the model's chat template renders the conversation.
    ``logprobs: true`` reports each generated token's logprob, ``top_logprobs`` (0..20, needs
    ``logprobs``) its most likely alternatives."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    echo: bool = False  # the last message's content before the reply, when it is the assistant's
    # chat template (vLLM's extensions; server/chat_prompt.py)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # tools (server/tools.py); tools also reach the chat template as ``tools``
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
