"""vLLM's tokenizer routes: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``,
and ``GET /version``.

Request and response shapes follow vLLM's ``entrypoints/openai/protocol.py``:

- ``/tokenize`` with ``prompt`` (``add_special_tokens`` default true) or with ``messages``
  (rendered by the chat template like a chat request: ``add_generation_prompt``,
  ``continue_final_message``, ``chat_template``, ``chat_template_kwargs``, ``tools``;
  ``add_special_tokens`` default false) -> ``{"count", "max_model_len", "tokens",
  "token_strs"}`` (``token_strs``: the vocabulary spelling of each id, when
  ``return_token_strs``).
- ``/detokenize`` with ``tokens`` -> ``{"prompt"}`` (special tokens kept, as vLLM).
- ``/tokenizer_info`` -> ``tokenizer_class``, the special tokens (``bos_token``,
  ``eos_token``...), ``chat_template``, ``vocab_size``, ``model_max_length`` (what
  lm-evaluation-harness's remote tokenizer reads).
- ``/version`` -> ``{"version"}``.

``/tokenize`` and ``/detokenize`` take the generation routes' size limits
(:mod:`pagedattn.server.limits`): a text prompt (or a rendered conversation) longer in bytes
than the context can spell is refused before it is tokenised, and ``/detokenize`` takes at most
``max_model_len`` ids; both answer 400 ``context_length_exceeded`` naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

import pagedattn.server.protocol as p
from pagedattn.server.chat_prompt import template_options
from pagedattn.server.errors import APIError
from pagedattn.server.limits import RequestLimits
from pagedattn.server.request_base import OpenAIRequest
from pagedattn.server.served_model import ServedModel
from pagedattn.server.tools import template_messages


class _Strict(OpenAIRequest):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class TokenizeCompletionRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Strict):
    model: str | None = None
    messages: list[p.ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


def package_version() -> str:
    """The installed pagedattn version (``0+unknown`` when run from a bare source tree)."""
    try:
        return version("pagedattn")
    except PackageNotFoundError:
        return "0+unknown"


def add_tokenizer_routes(
    app: FastAPI,
    served: ServedModel,
    limits: RequestLimits,
    auth: Sequence[Any],
    errors: dict[int | str, Any],
) -> None:
    """Register the routes of this module on ``app`` (``auth``: the route dependencies;
    ``limits``: the generation routes' size limits, which these routes share)."""
    deps = list(auth)

    def tokenizer() -> Any:
        tok = served.tokenizer
        if tok is None:
            raise APIError(400, "this model has no tokenizer")
        return tok

    @app.post("/tokenize", dependencies=deps, response_model=TokenizeResponse, responses=errors)
    async def tokenize(
        request: TokenizeCompletionRequest | TokenizeChatRequest,
    ) -> JSONResponse:
        """Token ids of a prompt, or of a conversation rendered by the chat template (built
        and serialised off the event loop: a long prompt has a long answer)."""
        served.check_model(request.model)
        return await run_in_threadpool(tokenize_blocking, request)

    def tokenize_blocking(
        request: TokenizeCompletionRequest | TokenizeChatRequest,
    ) -> JSONResponse:
        tok = tokenizer()
        if isinstance(request, TokenizeChatRequest):
            options = template_options(
                request.add_generation_prompt,
                request.continue_final_message,
                request.chat_template,
                request.chat_template_kwargs,
                request.tools,
            )
            messages = template_messages(
                [
                    {**(m.model_extra or {}), "role": m.role, "content": m.text()}
                    for m in request.messages
                ]
            )
            for m in request.messages:
                limits.check_prompt_bytes(m.text(), "messages")
            try:
                text = tok.apply_chat_template(messages, **options)
            except ValueError as exc:
                raise APIError(400, str(exc), param="messages") from exc
            limits.check_prompt_bytes(text, "messages")
        else:
            text = request.prompt
            limits.check_prompt_bytes(text, "prompt")
        ids = list(tok.encode(text, add_special_tokens=request.add_special_tokens))
        strs = [tok.id_to_token(i) or "" for i in ids] if request.return_token_strs else None
        body = {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids}
        return JSONResponse({**body, "token_strs": strs})

    @app.post("/detokenize", dependencies=deps, response_model=DetokenizeResponse, responses=errors)
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        """Text of token ids (ids outside the vocabulary are a 400)."""
        served.check_model(request.model)
        limit = served.max_model_len
        if limit is not None and len(request.tokens) > limit:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens; got "
                f"{len(request.tokens)} tokens to detokenize.",
                param="tokens",
                code="context_length_exceeded",
            )
        try:
            return DetokenizeResponse(prompt=tokenizer().decode(request.tokens))
        except ValueError as exc:
            raise APIError(400, f"tokens: {exc}", param="tokens") from exc

    @app.get("/tokenizer_info", dependencies=deps, responses=errors)
    async def tokenizer_info() -> dict[str, Any]:
        """The tokenizer's configuration: class, special tokens, chat template, sizes."""
        tok = tokenizer()
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **{k: v for k, v in tok.special_tokens.items()},
            "eos_token_id": tok.eos_token_id,
            "bos_token_id": tok.bos_token_id,
            "chat_template": tok.chat_template,
            "vocab_size": tok.vocab_size,
            "model_max_length": served.max_model_len,
        }

    @app.get("/version", response_model=VersionResponse)
    async def get_version() -> VersionResponse:
        """The server's pagedattn version."""
        return VersionResponse(version=package_version())
