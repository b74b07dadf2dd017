"""OpenAI-compatible response bodies (pydantic v2): completions, chat completions and their
stream chunks, usage, logprobs, tool calls, the model list and the error body. Field names
follow the OpenAI API reference; :mod:`pagedattn.server.protocol` re-exports them beside the
request models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from pagedattn.server.prompt_logprobs import PromptLogprobs


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
    prompt_token_ids: list[int] | None = None  # vLLM's return_token_ids (left out when None)
    token_ids: list[int] | None = None


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
    token_ids: list[int] | None = None  # vLLM's return_token_ids (left out when None)


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's return_token_ids (left out when None)


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None
    token_ids: list[int] | None = None  # vLLM's return_token_ids (left out when None)


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's return_token_ids, on the first chunk


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


TOKEN_ID_FIELDS = ("prompt_token_ids", "token_ids")  # present only when asked (vLLM's rule)


def dump(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict of a response model (vLLM's token-id fields only when set)."""
    data = model.model_dump(mode="json")
    for part in (data, *(data.get("choices") or ())):
        for key in TOKEN_ID_FIELDS:
            if key in part and part[key] is None:
                del part[key]
    return data
