"""One request cannot take the server down: an oversized body is a 413 read in bounded chunks,
a prompt longer in bytes than the context can hold is refused before it is tokenised, wrong
types are 400s (never coerced), a lone surrogate or a schema with no instance is a 400 naming
the field, and an unexpected 500 keeps the client's connection and is counted."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, ServerFactory
from tests.server.test_errors import CHAT, GOOD, assert_error_shape, assert_good_request_works

LIMIT = 64 * 1024


def raw_exchange(srv: RunningServer, sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request on ``sock`` and read one response (Content-Length framed)."""
    sock.sendall(request)
    return read_response(sock)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:])
    length = int({k.lower(): v for k, v in headers.items()}["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a response body"
        body += chunk
    return status, body[:length]


def post_bytes(path: str, body: bytes, port: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def connect(srv: RunningServer) -> tuple[socket.socket, int]:
    port = int(srv.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock, port


# ---- body size -------------------------------------------------------------------------------
def test_an_oversized_body_is_a_413_and_the_connection_serves_the_next_request(
    make_server: ServerFactory,
) -> None:
    with make_server(max_request_bytes=LIMIT) as srv:
        big = {**GOOD, "prompt": "x" * (LIMIT + 1)}
        with httpx.Client(timeout=60) as client:
            r = client.post(f"{srv.url}/v1/completions", json=big)
            error = assert_error_shape(r, 413)
            assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]
            assert error["type"] == "invalid_request_error"
            r = client.post(f"{srv.url}/v1/completions", json=GOOD)
            assert r.status_code == 200, r.text
        assert_good_request_works(srv)


def test_a_declared_50_mb_body_is_refused_before_it_is_sent(make_server: ServerFactory) -> None:
    with make_server(max_request_bytes=LIMIT) as srv:
        sock, port = connect(srv)
        with sock:
            head = (
                f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n"
            )
            sock.sendall(head.encode())  # and not one byte of the body
            status, body = read_response(sock)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200


def test_a_chunked_body_is_refused_once_it_passes_the_limit(make_server: ServerFactory) -> None:
    """The server answers after reading just past the limit: it never waits for (or holds)
    the rest of a 50 MB body."""
    with make_server(max_request_bytes=LIMIT) as srv:
        sock, port = connect(srv)
        with sock:
            head = (
                f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            sock.sendall(head.encode())
            chunk = b'{"prompt": "' + b"x" * 16 * 1024
            sent = 0
            while sent <= LIMIT + len(chunk):  # a little past the limit, then stop sending
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
                chunk = b"x" * 16 * 1024
            status, body = read_response(sock)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        assert_good_request_works(srv)


# ---- prompt size -----------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_a_prompt_too_long_in_bytes_is_refused_before_it_is_tokenised(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    engine = server.app.state.async_engine.engine
    tokenizer = engine.tokenizer
    # the oracle: no token of the vocabulary spells more bytes than its longest one
    longest = max(
        len(tokenizer.decode([i], skip_special_tokens=False).encode())
        for i in range(tokenizer.vocab_size)
    )
    max_model_len = engine.scheduler.max_model_len
    text = "a" * (max_model_len * longest + 1)
    seen: list[int] = []
    real = tokenizer.encode

    def spy(text: str, *args: Any, **kwargs: Any) -> list[int]:
        seen.append(len(text))
        return list(real(text, *args, **kwargs))

    monkeypatch.setattr(tokenizer, "encode", spy)
    if route == "completions":
        path, body, param = "/v1/completions", {**GOOD, "prompt": text}, "prompt"
    else:
        path, param = "/v1/chat/completions", "messages"
        body = {**CHAT, "messages": [{"role": "user", "content": text}]}
    r = httpx.post(server.url + path, json=body, timeout=60)
    error = assert_error_shape(r, 400)
    assert error["param"] == param and error["code"] == "context_length_exceeded"
    assert all(n < len(text) for n in seen), "the long prompt reached the tokenizer"
    monkeypatch.undo()
    # one byte under the bound is tokenised (and refused by its token count)
    r = httpx.post(server.url + path, json=body | _shorter(body, longest), timeout=60)
    assert assert_error_shape(r, 400)["code"] == "context_length_exceeded"
    assert_good_request_works(server)


def _shorter(body: dict[str, Any], longest: int) -> dict[str, Any]:
    if "prompt" in body:
        return {"prompt": body["prompt"][: -longest - 1]}
    content = body["messages"][0]["content"][: -longest - 1]
    return {"messages": [{"role": "user", "content": content}]}


# ---- strict types ----------------------------------------------------------------------------
WRONG_TYPES: list[tuple[str, str, str, str]] = [
    # (id, path, raw JSON body, param)
    ("max-tokens-true", "/v1/completions", '{"prompt": "hi", "max_tokens": true}', "max_tokens"),
    ("max-tokens-string", "/v1/completions", '{"prompt": "hi", "max_tokens": "10"}', "max_tokens"),
    ("max-tokens-float", "/v1/completions", '{"prompt": "hi", "max_tokens": 3.5}', "max_tokens"),
    ("n-string", "/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], '
     '"n": "2"}', "n"),
    ("stream-yes", "/v1/completions", '{"prompt": "hi", "stream": "yes"}', "stream"),
    ("stream-1", "/v1/completions", '{"prompt": "hi", "stream": 1}', "stream"),
    ("prompt-bools", "/v1/completions", '{"prompt": [true, false]}', "prompt"),
    ("temperature-infinity", "/v1/completions", '{"prompt": "hi", "temperature": Infinity}',
     "temperature"),
    ("temperature-nan", "/v1/completions", '{"prompt": "hi", "temperature": NaN}', "temperature"),
    ("top-p-true", "/v1/completions", '{"prompt": "hi", "top_p": true}', "top_p"),
    ("logprobs-true", "/v1/completions", '{"prompt": "hi", "logprobs": true}', "logprobs"),
    ("bias-nan", "/v1/completions", '{"prompt": "hi", "logit_bias": {"5": NaN}}', "logit_bias"),
    ("echo-string", "/v1/completions", '{"prompt": "hi", "echo": "true"}', "echo"),
    ("include-usage-string", "/v1/completions", '{"prompt": "hi", "stream": true, '
     '"stream_options": {"include_usage": "yes"}}', "stream_options"),
    ("stream-options-without-stream", "/v1/completions", '{"prompt": "hi", '
     '"stream_options": {"include_usage": true}}', "stream_options"),
    ("stream-options-with-stream-false", "/v1/chat/completions", '{"messages": [{"role": '
     '"user", "content": "hi"}], "stream": false, "stream_options": {"include_usage": true}}',
     "stream_options"),
    ("tokenize-special-string", "/tokenize", '{"prompt": "hi", "add_special_tokens": "no"}',
     "add_special_tokens"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "param"), [c[1:] for c in WRONG_TYPES], ids=[c[0] for c in WRONG_TYPES]
)
def test_wrong_types_are_400s_naming_the_field(
    server: RunningServer, path: str, body: str, param: str
) -> None:
    r = httpx.post(
        server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60
    )
    error = assert_error_shape(r, 400)
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    assert_good_request_works(server)


def test_an_integer_is_still_a_valid_float(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json={**GOOD, "top_p": 1}, timeout=60)
    assert r.status_code == 200, r.text


# ---- lone surrogates -------------------------------------------------------------------------
SURROGATES: list[tuple[str, str, str, str]] = [
    ("prompt", "/v1/completions", '{"prompt": "ab\\ud800c", "max_tokens": 2}', "prompt"),
    ("prompt-list", "/v1/completions", '{"prompt": ["\\udfff"], "max_tokens": 2}', "prompt"),
    ("stop", "/v1/completions", '{"prompt": "hi", "stop": ["\\ud800"]}', "stop"),
    ("message-content", "/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages"),
    ("message-extra-field", "/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "hi", "tool_call_id": "\\ud800"}]}',
     "messages"),
    ("template-kwargs-key", "/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "hi"}], '
     '"chat_template_kwargs": {"\\ud800": 1}}', "chat_template_kwargs"),
    ("tokenize", "/tokenize", '{"prompt": "\\ud800"}', "prompt"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "param"), [c[1:] for c in SURROGATES], ids=[c[0] for c in SURROGATES]
)
def test_a_lone_surrogate_is_a_400_naming_the_field(
    server: RunningServer, path: str, body: str, param: str
) -> None:
    r = httpx.post(
        server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60
    )
    error = assert_error_shape(r, 400)
    assert error["param"] == param and "surrogate" in error["message"], error
    assert_good_request_works(server)


def test_a_surrogate_pair_is_text(server: RunningServer) -> None:
    body = '{"prompt": "hi \\ud83d\\ude00", "max_tokens": 2, "temperature": 0}'
    r = httpx.post(
        f"{server.url}/v1/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 200, r.text


# ---- unexpected errors -----------------------------------------------------------------------
def test_an_unexpected_500_keeps_the_connection_and_is_counted(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.app.state.async_engine.engine

    def broken_template(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("template exploded")

    before = server.metrics().get("pagedattn:unexpected_errors_total", 0.0)
    monkeypatch.setattr(engine.tokenizer, "apply_chat_template", broken_template)
    sock, port = connect(server)
    with sock:
        status, body = raw_exchange(
            server, sock, post_bytes("/v1/chat/completions", json.dumps(CHAT).encode(), port)
        )
        assert status == 500 and "template exploded" in json.loads(body)["error"]["message"]
        monkeypatch.undo()
        # the same connection serves the next request
        status, body = raw_exchange(
            server, sock, post_bytes("/v1/completions", json.dumps(GOOD).encode(), port)
        )
        assert status == 200, body
    assert server.metrics()["pagedattn:unexpected_errors_total"] == before + 1
    assert_good_request_works(server)


# ---- schemas with no instance ----------------------------------------------------------------
NO_INSTANCE = [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"allOf": [{"$ref": "#"}]},
]


@pytest.mark.parametrize("schema", NO_INSTANCE, ids=["self", "defs-self", "mutual", "allof"])
@pytest.mark.parametrize("field", ["response_format", "guided_json"])
def test_a_self_referencing_schema_is_a_400_naming_the_field(
    server: RunningServer, schema: dict[str, Any], field: str
) -> None:
    constraint: dict[str, Any] = (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
        if field == "response_format"
        else {"guided_json": schema}
    )
    r = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, **constraint}, timeout=60)
    error = assert_error_shape(r, 400)
    assert error["param"] == field and "admits no output" in error["message"]
    assert "<state>" not in error["message"]
    assert_good_request_works(server)


def test_a_recursive_schema_with_a_base_case_is_served(server: RunningServer) -> None:
    tree = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["v"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "tree", "schema": tree}}
    body = {**GOOD, "response_format": fmt, "max_tokens": 40}  # no chat: no cached template
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text.startswith('{"v": ')  # a prefix of a valid instance (it may hit max_tokens)
