"""`pagedattn serve` on the embedded SmolLM2-135M-Instruct, driven by the openai client."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.server.test_auth_and_cli import _free_port


@pytest.mark.model
def test_smollm2_chat_names_paris() -> None:
    import openai

    port = _free_port()
    cmd = [sys.executable, "-c", "from pagedattn.cli import main; main()", "serve"]
    cmd += ["--port", str(port), "--kv-cache-mib", "64", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        out = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=messages, max_tokens=24, temperature=0
        )
        assert "Paris" in (out.choices[0].message.content or "")
        assert out.usage.completion_tokens <= 24 and out.usage.prompt_tokens > 10
        stream = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
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
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
