"""Whole (non-streamed) responses: one OpenAI choice per completion of the request."""

from __future__ import annotations

from collections.abc import Callable

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from pagedattn.server.logprobs import chat_logprobs, completion_logprobs
from pagedattn.server.prepared import Prepared
from pagedattn.server.prompt_logprobs import PromptLogprobs, prompt_logprobs_of
from pagedattn.server.tool_replies import finish_reason_of, reply_of

openai_finish_reason = finish_reason_of  # OpenAI's finish reason of a choice


def usage_of(out: RequestOutput, num_generated_tokens: int) -> p.Usage:
    """The usage block of a request, given how many tokens all its choices generated."""
    return p.make_usage(out.num_prompt_tokens, num_generated_tokens, out.num_cached_tokens)


def echo_logprobs(out: RequestOutput) -> list[PositionLogprobs | None]:
    """The prompt's positions (first None) for ``echo`` with logprobs.

    Raises:
        ValueError: the output has no prompt logprobs.
    """
    if out.prompt_logprobs is None:
        raise ValueError("prompt_logprobs: expected them with echo + logprobs, got None")
    return list(out.prompt_logprobs)


def completion_choice(
    out: RequestOutput,
    c: CompletionOutput,
    prepared: Prepared,
    decode: Callable[[int], str],
    *,
    with_prompt: bool,
    initial_offset: int = 0,
    finish: bool = True,
    prompt_ids: bool | None = None,
) -> p.CompletionChoice:
    """One completions choice for ``c`` (the whole completion, or one delta of it); under echo
    and ``with_prompt`` the prompt text and its logprobs come first. Asked for token ids, the
    choice carries ``c``'s and (``prompt_ids``, default ``with_prompt``) the prompt's."""
    text, ids = c.text, list(c.token_ids)
    positions: list[PositionLogprobs | None] = list(c.logprobs or [])
    if with_prompt and prepared.echo_text is not None:
        text = prepared.echo_text + text
        ids = [*out.prompt_token_ids, *ids]
        if prepared.num_top is not None:
            positions = [*echo_logprobs(out), *positions]
    logprobs = None
    if prepared.num_top is not None:
        logprobs = completion_logprobs(
            ids, positions, prepared.num_top, decode, initial_offset, prepared.tokens_as_ids
        )
    with_ids = prepared.token_ids
    send_prompt = with_prompt if prompt_ids is None else prompt_ids
    return p.CompletionChoice(
        index=c.index,
        text=text,
        logprobs=logprobs,
        finish_reason=openai_finish_reason(c) if finish else None,
        stop_reason=c.stop_reason if finish else None,
        prompt_logprobs=asked_prompt_logprobs(out, prepared, decode) if with_prompt else None,
        prompt_token_ids=list(out.prompt_token_ids) if with_ids and send_prompt else None,
        token_ids=list(c.token_ids) if with_ids else None,
    )


def asked_prompt_logprobs(
    out: RequestOutput, prepared: Prepared, decode: Callable[[int], str]
) -> PromptLogprobs | None:
    """The request's ``prompt_logprobs`` when it asked for them, else None.

    Raises:
        ValueError: asked, but the output has no prompt logprobs.
    """
    if prepared.prompt_logprobs is None:
        return None
    if out.prompt_logprobs is None:
        raise ValueError("prompt_logprobs: asked for, but the engine returned none")
    return prompt_logprobs_of(
        out.prompt_token_ids, out.prompt_logprobs, prepared.prompt_logprobs, decode
    )


def completion_response(
    out: RequestOutput,
    request_id: str,
    model: str,
    prepared: Prepared,
    decode: Callable[[int], str],
) -> p.Completion:
    """The whole completions response of a finished request."""
    choices = [completion_choice(out, c, prepared, decode, with_prompt=True) for c in out.outputs]
    return p.Completion(
        id=request_id,
        created=p.now_s(),
        model=model,
        choices=choices,
        usage=usage_of(out, sum(len(c.token_ids) for c in out.outputs)),
    )


def chat_choice_logprobs(
    c: CompletionOutput, prepared: Prepared, decode: Callable[[int], str]
) -> p.ChatLogprobs | None:
    """Chat logprobs of ``c``'s tokens when asked, else None."""
    if prepared.num_top is None:
        return None
    return chat_logprobs(
        c.token_ids, c.logprobs or [], prepared.num_top, decode, prepared.tokens_as_ids
    )


def chat_response(
    out: RequestOutput,
    request_id: str,
    model: str,
    prepared: Prepared,
    decode: Callable[[int], str],
) -> p.ChatCompletion:
    """The whole chat response of a finished request."""
    choices = []
    for c in out.outputs:
        message, reason = reply_of(c, prepared.tools)
        if prepared.echo_text:  # chat echo: the assistant's last message goes first
            message = message.model_copy(
                update={"content": prepared.echo_text + (message.content or "")}
            )
        choices.append(
            p.ChatChoice(
                index=c.index,
                message=message,
                logprobs=chat_choice_logprobs(c, prepared, decode),
                finish_reason=reason,
                stop_reason=c.stop_reason,
                token_ids=list(c.token_ids) if prepared.token_ids else None,
            )
        )
    return p.ChatCompletion(
        id=request_id,
        created=p.now_s(),
        model=model,
        choices=choices,
        usage=usage_of(out, sum(len(c.token_ids) for c in out.outputs)),
        prompt_logprobs=asked_prompt_logprobs(out, prepared, decode),
        prompt_token_ids=list(out.prompt_token_ids) if prepared.token_ids else None,
    )
