"""Render a chat request to prompt token ids (vLLM's chat-template request fields).

- ``add_generation_prompt`` (default true): end with the header that opens the assistant turn.
- ``continue_final_message`` (default false): assistant prefill: the prompt ends right after
  the last message's text, so the reply continues it (transformers' semantics). Both true is
  a 400.
- ``chat_template``: a Jinja2 template used instead of the model's (rendered in the same
  sandbox).
- ``chat_template_kwargs``: extra template variables (e.g. ``{"enable_thinking": false}``);
  the names the server sets itself (``messages``, ``add_generation_prompt``,
  ``continue_final_message``, ``tools``, ``chat_template``) are refused there.
- ``tools`` reach the template as ``tools``; an assistant message's ``tool_calls`` reach it
  with their arguments as objects (see :mod:`pagedattn.server.tools`); vLLM's ``documents``
  reach it as ``documents``.
- vLLM's ``add_special_tokens`` (default false: the template writes its own): true adds the
  tokenizer's special tokens (BOS...) around the rendered prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pagedattn.server.protocol as p
from pagedattn.server.errors import APIError
from pagedattn.server.tools import template_messages

RESERVED_KWARGS = frozenset(
    {"messages", "add_generation_prompt", "continue_final_message", "tools", "chat_template"}
)


def chat_messages(req: p.ChatCompletionRequest) -> list[dict[str, Any]]:
    """The conversation as template dicts: ``role``, ``content`` (text parts joined), ``name``
    when given, and any other message field (``tool_calls``...) as sent."""
    out = []
    for m in req.messages:
        message: dict[str, Any] = {**(m.model_extra or {}), "role": m.role, "content": m.text()}
        if m.name is not None:
            message["name"] = m.name
        out.append(message)
    return template_messages(out)


def template_options(
    add_generation_prompt: bool,
    continue_final_message: bool,
    chat_template: str | None,
    chat_template_kwargs: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """Keyword arguments for ``Tokenizer.apply_chat_template`` / ``encode_chat``.

    Raises:
        APIError: 400 for both generation flags at once, or a reserved template variable in
            ``chat_template_kwargs``.
    """
    if add_generation_prompt and continue_final_message:
        raise APIError(
            400,
            "continue_final_message: cannot be true together with add_generation_prompt "
            "(send add_generation_prompt: false to continue the last message)",
            param="continue_final_message",
        )
    kwargs = dict(chat_template_kwargs or {})
    reserved = sorted(RESERVED_KWARGS & set(kwargs))
    if reserved:
        raise APIError(
            400,
            f"chat_template_kwargs: {reserved} are set by the request itself",
            param="chat_template_kwargs",
        )
    if tools:
        kwargs["tools"] = tools
    return {
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "chat_template": chat_template,
        **kwargs,
    }


def chat_prompt_ids(
    req: p.ChatCompletionRequest,
    tokenizer: Any,
    check_text: Callable[[str], None] | None = None,
) -> list[int]:
    """The prompt token ids of a chat request: the conversation rendered by the chat template,
    then tokenised (the template writes its own special tokens).

    Args:
        check_text: called with the rendered prompt before it is tokenised (a size check
            that raises APIError).

    Raises:
        APIError: 400 (see :func:`template_options`; a template error or an empty prompt,
            naming ``chat_template`` when the request sent one, else ``messages``).
    """
    if tokenizer is None:
        raise APIError(400, "messages: this model has no tokenizer", param="messages")
    options = template_options(
        req.add_generation_prompt,
        req.continue_final_message,
        req.chat_template,
        req.chat_template_kwargs,
        req.tools,
    )
    if req.documents is not None:
        options["documents"] = req.documents
    field = "chat_template" if req.chat_template is not None else "messages"
    try:
        text = tokenizer.apply_chat_template(chat_messages(req), **options)
    except ValueError as exc:
        param = "continue_final_message" if "continue_final_message" in str(exc) else field
        raise APIError(400, str(exc), param=param) from exc
    if check_text is not None:
        check_text(text)
    special = bool(req.add_special_tokens)
    ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=special)]
    if not ids:
        raise APIError(400, "messages: the rendered prompt is empty", param="messages")
    return ids
