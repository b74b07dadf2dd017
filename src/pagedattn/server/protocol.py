"""OpenAI-compatible request and response models (pydantic v2).

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

from pydantic import BaseModel, Field

from pagedattn.server.prompt_logprobs import PromptLogprobs
from pagedattn.server.request_base import OpenAIRequest
from pagedattn.server.structured_outputs import StructuredOutputs


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
    or ``json_schema`` (the given schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(OpenAIRequest):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` and no choices."""

    include_usage: bool = False


class SamplingFields(OpenAIRequest):
    """Fields shared by both generation endpoints (OpenAI's, plus vLLM's sampling extensions
    ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``stop_token_ids``,
    ``include_stop_str_in_output``, ``skip_special_tokens``, ``ignore_eos``).

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
    # the prompt's own logprobs (vLLM's format; server/prompt_logprobs.py)
    prompt_logprobs: int | None = None
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
    (``tool_calls``, ``tool_call_id``...) reach the chat template as they are."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message text (parts joined with no separator, None as "")."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
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


# ---- responses ---------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    """``cached_tokens``: prompt tokens served from the prefix cache."""

    cached_tokens: int = 0


class Usage(BaseModel):
    """Token counts of one request (prompt = tokenizer count of the rendered prompt)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    """A :class:`Usage` with ``total_tokens`` = prompt + completion."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


FinishReason = Literal["stop", "length", "tool_calls"]


class CompletionLogprobs(BaseModel):
    """OpenAI's completions ``logprobs``: per token its text, logprob (None for the first
    prompt token under ``echo``), the top-N alternatives (text -> logprob) and the character
    offset of the token in the choice's text."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class Completion(BaseModel):
    """A completions response, or (``stream``) one chunk of it."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class FunctionCall(BaseModel):
    """A call's function: its name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolCall(BaseModel):
    """One entry of ``message.tool_calls``."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(ToolCall):
    """A streamed ``delta.tool_calls`` entry: a whole call, with its ``index`` in the reply."""

    index: int


class AssistantMessage(BaseModel):
    """The reply: ``content`` (None when the reply is only tool calls) and ``tool_calls``."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(BaseModel):
    """One alternative: token text, logprob, UTF-8 bytes of the text."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    """One generated token's logprob with its ``top_logprobs`` alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """OpenAI's chat ``logprobs``: ``content`` holds one entry per generated token."""

    content: list[ChatTokenLogprob] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None
    stop_reason: int | str | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pagedattn"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorBody


def dump(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict of a response model."""
    return model.model_dump(mode="json")
