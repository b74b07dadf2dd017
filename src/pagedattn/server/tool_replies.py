"""Replies of requests that may call tools: whole messages, and streamed deltas.

Streaming under ``tool_choice: "auto"`` sends text as content until the call's opening tag
could begin (a suffix that is a prefix of the tag, and trailing whitespace, wait for the next
delta); once the tag is written nothing more goes out as content, and when the choice
finishes its calls come in one ``delta.tool_calls`` chunk (whole calls, each with its
``index``, ``id``, ``type`` and ``function``), then the finish chunk. Under ``"required"`` and
a named function the reply is the call itself: no content is streamed.
"""

from __future__ import annotations

import pagedattn.server.protocol as p
from pagedattn.engine.outputs import CompletionOutput
from pagedattn.server.tools import ToolPlan, tool_calls_of


def finish_reason_of(c: CompletionOutput) -> p.FinishReason | None:
    """OpenAI's finish reason: "length" for the engine's "length", else "stop" (None while
    running)."""
    if c.finish_reason is None:
        return None
    return "length" if c.finish_reason == "length" else "stop"


def reply_of(
    c: CompletionOutput, plan: ToolPlan | None
) -> tuple[p.AssistantMessage, p.FinishReason | None]:
    """The message of a finished choice and its finish reason (``tool_calls`` when it holds
    calls; a reply whose calls did not complete is its text, reason unchanged)."""
    reason = finish_reason_of(c)
    if plan is None or c.finish_reason == "length":
        return p.AssistantMessage(content=c.text), reason
    parsed = plan.parse(c.text)
    if parsed is None or not parsed[1]:
        return p.AssistantMessage(content=c.text), reason
    content, calls = parsed
    return p.AssistantMessage(content=content, tool_calls=tool_calls_of(calls)), "tool_calls"


class ToolStream:
    """What to stream of one choice's text under a tool plan."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0

    def feed(self, delta: str) -> str:
        """The content to send now, given the choice's next text ``delta``."""
        self.text += delta
        if self.plan.mode != "auto" or self.plan.fmt is None:
            return ""
        tag = self.plan.fmt.open_tag
        found = self.text.find(tag)
        if found >= 0:
            limit = found
        else:
            limit = len(self.text)
            for k in range(min(len(tag) - 1, len(self.text)), 0, -1):
                if self.text.endswith(tag[:k]):
                    limit -= k
                    break
        limit = len(self.text[:limit].rstrip())
        if limit <= self.sent:
            return ""
        out = self.text[self.sent : limit]
        self.sent = limit
        return out

    def finish(
        self, c: CompletionOutput
    ) -> tuple[str, list[p.ToolCallDelta], p.FinishReason | None]:
        """(content not sent yet, the calls, finish reason) of the finished choice ``c``."""
        message, reason = reply_of(
            CompletionOutput(index=c.index, text=self.text, finish_reason=c.finish_reason),
            self.plan,
        )
        if not message.tool_calls:
            return self.text[self.sent :], [], reason
        calls = [
            p.ToolCallDelta(index=i, id=call.id, function=call.function)
            for i, call in enumerate(message.tool_calls)
        ]
        return "", calls, reason
