"""Replies encoded piece by piece are byte for byte what Starlette's ``JSONResponse`` sends,
and no piece handed to the C encoder (which holds the GIL for its whole call) is large."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from starlette.responses import JSONResponse

import pagedattn.server.json_body as json_body
from pagedattn.server.json_body import json_bytes, json_response

RNG = np.random.default_rng(7)


def _reply(positions: int) -> dict[str, Any]:
    """A completions reply shaped like one with prompt logprobs 20 + echo + logprobs 20."""
    words = ["é", "日本", 'a"b', "\\n", "\n", " the", "\u2028", "🙂", ""]

    def word() -> str:
        return str(words[int(RNG.integers(len(words)))]) + str(int(RNG.integers(99)))

    prompt_lp: list[Any] = [None]
    top: list[Any] = [None]
    for _ in range(positions - 1):
        ids = RNG.choice(49152, 21, replace=False)
        prompt_lp.append(
            {
                str(int(i)): {
                    "logprob": float(-RNG.random() * 20),
                    "rank": r + 1,
                    "decoded_token": word(),
                }
                for r, i in enumerate(ids)
            }
        )
        top.append({word(): float(-RNG.random() * 5) for _ in range(21)})
    return {
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{
            "index": 0, "text": "x" * 1000, "finish_reason": "length", "stop_reason": None,
            "prompt_logprobs": prompt_lp,
            "logprobs": {"tokens": [word() for _ in range(positions)],
                         "token_logprobs": [None, *(-RNG.random() for _ in range(positions - 1))],
                         "top_logprobs": top, "text_offset": list(range(positions))},
        }],
        "usage": {"prompt_tokens": positions, "completion_tokens": 1,
                  "total_tokens": positions + 1},
        "empty": {}, "nested": [[[]], [{}], {"k": [1, 2.5, True, False, None]}],
        "wide": {f"k{i}": i for i in range(500)}, "ints": {1: "one"},
    }  # fmt: skip


@pytest.mark.parametrize("positions", [1, 3, 64, 65, 129, 2000])
def test_the_bytes_equal_starlettes_json_response(positions: int) -> None:
    content = _reply(positions)
    assert json_bytes(content) == JSONResponse(content).body
    response = json_response(content, status_code=201)
    assert response.body == JSONResponse(content).body
    assert response.status_code == 201
    assert response.headers["content-type"] == "application/json"


@pytest.mark.parametrize("value", [[], {}, "", 0, -1.5, None, True, [[]], {"a": {}}, "ü"])
def test_small_values_equal_starlettes(value: Any) -> None:
    assert json_bytes(value) == JSONResponse(value).body


def test_no_piece_is_large(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real = json_body._encode

    def spy(value: Any) -> str:
        out = real(value)
        sizes.append(len(out))
        return out

    monkeypatch.setattr(json_body, "_encode", spy)
    body = json_bytes(_reply(5000))
    assert len(body) > 5_000_000
    assert max(sizes) < 200_000  # at most SLICE positions of 21 entries at a time


@pytest.mark.parametrize("bad", [math.nan, math.inf, [1, -math.inf], {"a": [math.nan]}])
def test_nan_is_refused_as_starlette_does(bad: Any) -> None:
    with pytest.raises(ValueError):
        JSONResponse(bad)
    with pytest.raises(ValueError):
        json_bytes(bad)


def test_a_value_json_cannot_hold_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        json_bytes({"a": [object()] * 100})
