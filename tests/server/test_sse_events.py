"""The per-token chat event (text alone) against OpenAI's chunk written out by hand, for texts
JSON must escape."""

from __future__ import annotations

import json

import pytest

from pagedattn.server.sse import ContentEvents


@pytest.mark.parametrize(
    "text",
    ['say "hi"', "back\\slash", "line\nbreak\ttab", "café ☕ 😀", "\x00content", "\\u0000content"],
)
def test_content_event_is_the_openai_chunk_of_the_text(text: str) -> None:
    events = ContentEvents("chatcmpl-x1", 1700000000, "my-model")
    for index in (0, 3, 0):
        event = events(index, text)
        expected = {
            "id": "chatcmpl-x1",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "my-model",
            "choices": [
                {
                    "index": index,
                    "delta": {"content": text},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "usage": None,
            "system_fingerprint": None,
        }
        assert event == f"data: {json.dumps(expected, separators=(',', ':'))}\n\n"
        assert json.loads(event[6:]) == expected
