"""`pagedattn serve` on the embedded SmolLM2-135M-Instruct, driven by the openai client."""

from __future__ import annotations

import pytest

from tests.server.conftest import serve_subprocess


@pytest.mark.model
def test_smollm2_chat_names_paris() -> None:
    import openai

    args = ["--kv-cache-mib", "64", "--log-level", "warning"]
    with serve_subprocess(args, timeout=120) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        # the model's own name, and the one `pagedattn models` lists it under
        names = [m.id for m in client.models.list().data]
        assert names == ["SmolLM2-135M-Instruct", "smollm2-135m"]
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        out = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=messages, max_tokens=24, temperature=0
        )
        assert "Paris" in (out.choices[0].message.content or "")
        assert out.usage.completion_tokens <= 24 and out.usage.prompt_tokens > 10
        stream = client.chat.completions.create(
            model="smollm2-135m",
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == out.choices[0].message.content
        # the repeated conversation reused its prefix pages
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
