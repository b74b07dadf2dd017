"""Request fields that would change the output but are not served: each is a 400 naming it.

OpenAI answers an unknown parameter with ``400 Unrecognized request argument supplied: X``;
so does this server, so that a field a client believes honoured is never silently ignored.
Declared fields that are only partly served are checked here too: ``tool_choice`` without
``tools``, the deprecated ``functions`` with a ``function_call`` other than ``"none"`` (send
``tools``), ``modalities`` other than ``["text"]``, a non-empty completions ``suffix``. The
honoured / refused table of every field is in ``deploy/README.md``.
"""

from __future__ import annotations

import pagedattn.server.protocol as p
from pagedattn.server.errors import APIError


def check_request_fields(req: p.CompletionRequest | p.ChatCompletionRequest) -> None:
    """Raises APIError 400 naming the first field this server cannot honour."""
    extra = req.model_extra or {}
    if extra:
        name = next(iter(extra))
        raise APIError(400, f"Unrecognized request argument supplied: {name}", param=name)
    if isinstance(req, p.CompletionRequest):
        if req.suffix:
            raise APIError(400, "suffix: not supported (no fill-in-the-middle)", param="suffix")
        return
    if req.tool_choice not in (None, "none") and not req.tools:
        raise APIError(400, "tool_choice: no tools were given", param="tool_choice")
    if req.functions and req.function_call != "none":
        raise APIError(
            400,
            "functions: deprecated function calling is not served; send tools",
            param="functions",
        )
    if req.modalities is not None and req.modalities != ["text"]:
        raise APIError(
            400, f"modalities: only ['text'] is supported, got {req.modalities}", param="modalities"
        )
