"""A base model (a GGUF with no chat template) completes raw text: `generate` says so, the chat
routes and `pagedattn chat` refuse clearly instead of guessing a template. A template that
cannot render fails when the model loads, before anything is served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import pagedattn.cli.chat  # registers the command
import pagedattn.cli.generate  # noqa: F401  (registers the command)
from pagedattn.cli.app import app
from pagedattn.model.loader import load_model
from pagedattn.server.app import build_app
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf
from tests.server.conftest import TINY_OPTIONS, RunningServer, serve_app

runner = CliRunner()


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tiny_config()
    path = tmp_path_factory.mktemp("base") / "base.gguf"
    return write_tiny_gguf(path, config, random_weights(config, 0), chat_template=None)


@pytest.fixture(scope="module")
def base_server(base_gguf: Path) -> Iterator[RunningServer]:
    with serve_app(build_app(str(base_gguf), **TINY_OPTIONS)) as srv:
        yield srv


def test_chat_routes_are_a_400_naming_messages(base_server: RunningServer) -> None:
    body = {"model": "base", "messages": [{"role": "user", "content": "the cat"}]}
    reply = httpx.post(f"{base_server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "messages" and "no chat template" in error["message"]
    assert "/v1/completions" in error["message"]
    responses = httpx.post(
        f"{base_server.url}/v1/responses",
        json={"model": "base", "input": "the cat", "max_output_tokens": 4},
        timeout=60,
    )
    assert responses.status_code == 400 and "no chat template" in responses.text
    tokenized = httpx.post(f"{base_server.url}/tokenize", json=body, timeout=60)
    assert tokenized.status_code == 400 and tokenized.json()["error"]["param"] == "messages"
    assert "no chat template" in tokenized.json()["error"]["message"]


def test_completions_and_a_request_template_still_work(base_server: RunningServer) -> None:
    done = httpx.post(
        f"{base_server.url}/v1/completions",
        json={"model": "base", "prompt": "the cat", "max_tokens": 4, "temperature": 0},
        timeout=60,
    )
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] >= 1
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    chat = httpx.post(
        f"{base_server.url}/v1/chat/completions",
        json={
            "model": "base",
            "messages": [{"role": "user", "content": "the cat"}],
            "chat_template": template,
            "max_tokens": 4,
        },
        timeout=60,
    )
    assert chat.status_code == 200, chat.text


def test_generate_completes_raw_text_and_says_so(base_gguf: Path) -> None:
    args = ["generate", "the cat sat", "--model", str(base_gguf), "--max-tokens", "6"]
    plain = runner.invoke(app, args)
    raw = runner.invoke(app, [*args, "--raw"])
    assert plain.exit_code == 0 and raw.exit_code == 0, plain.stderr
    assert "no chat template" in plain.stderr and "completing PROMPT as is" in plain.stderr
    assert plain.stdout == raw.stdout
    system = runner.invoke(app, [*args, "--system", "Be brief."])
    assert system.exit_code == 1 and "--system needs a chat template" in system.stderr


def test_chat_command_refuses_a_base_model(base_gguf: Path) -> None:
    result = runner.invoke(app, ["chat", "--model", str(base_gguf)], input="hi\n")
    assert result.exit_code == 1
    assert "chat needs a chat template" in result.stderr and "pagedattn generate" in result.stderr


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{{ raise_exception('only system messages here') }}", "only system messages here"),
        ("{% for m in messages %}{{ m.content }}", "invalid chat template"),
        ("{{ messages[0]['content'] | nosuchfilter }}", "nosuchfilter"),
    ],
)
def test_a_template_that_cannot_render_fails_at_load(
    tmp_path: Path, template: str, reason: str
) -> None:
    config = tiny_config()
    path = write_tiny_gguf(
        tmp_path / "broken.gguf", config, random_weights(config, 0), chat_template=template
    )
    with pytest.raises(ValueError, match=r"chat template .*fails to render") as caught:
        load_model(path)
    assert reason in str(caught.value)
    with pytest.raises(ValueError, match=r"fails to render"):
        build_app(str(path), **TINY_OPTIONS)
