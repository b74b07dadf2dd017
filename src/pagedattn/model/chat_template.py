"""Render a chat template the way Hugging Face ``apply_chat_template`` does.

Same Jinja2 setup as transformers (``utils/chat_template_utils.py``): an
``ImmutableSandboxedEnvironment`` with ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols``
extension, a ``tojson`` filter that does not HTML-escape, and the ``raise_exception`` and
``strftime_now`` globals; the tokenizer's special tokens (``bos_token``, ``eos_token``...) are
template variables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template once (cached by its source text).

    Raises:
        ValueError: the template is not valid Jinja2.
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"invalid chat template: {exc}") from exc


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def render_chat_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    special_tokens: Mapping[str, str | None] | None = None,
    **kwargs: Any,
) -> str:
    """Render ``messages`` (dicts with ``role`` and ``content``) with a chat template.

    Args:
        source: the Jinja2 template text (``tokenizer.chat_template``).
        messages: the conversation, oldest first.
        add_generation_prompt: end with the header that opens an assistant turn.
        continue_final_message: end the prompt right after the last message's text (no
            end-of-turn tokens), so that the model continues that message (assistant prefill).
            As transformers does: the last message's content gets a marker appended, the
            rendered text is cut at the marker (trailing whitespace trimmed when the template
            trimmed it). Exclusive with ``add_generation_prompt``.
        special_tokens: template variables such as ``bos_token`` / ``eos_token``.
        **kwargs: extra template variables (e.g. ``tools``); they override ``special_tokens``.

    Returns:
        The rendered prompt text (special tokens appear as text; encode it with special-token
        recognition and without adding BOS).

    Raises:
        ValueError: a message is not a dict with a string ``role``, the template calls
            ``raise_exception`` (the template's message is kept), or ``continue_final_message``
            with ``add_generation_prompt``, with a last message whose content is not a string,
            or with a template that drops the last message's text.
    """
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}] must be a dict with a string 'role', got {message!r}")
    chat = [dict(m) for m in messages]
    final = ""
    if continue_final_message:
        if add_generation_prompt:
            raise ValueError(
                "continue_final_message: cannot be combined with add_generation_prompt"
            )
        if not chat or not isinstance(chat[-1].get("content"), str):
            raise ValueError("continue_final_message: the last message has no text to continue")
        final = chat[-1]["content"]
        chat[-1]["content"] = final + _CONTINUE_TAG
    template = compile_chat_template(source)
    variables = {**(special_tokens or {}), **kwargs}
    try:
        rendered = str(
            template.render(messages=chat, add_generation_prompt=add_generation_prompt, **variables)
        )
    except jinja2.exceptions.TemplateError as exc:
        raise ValueError(f"chat template error: {exc}") from exc
    if not continue_final_message:
        return rendered
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise ValueError(
            "continue_final_message: the chat template does not keep the last message's text"
        )
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()
