"""`pagedattn serve --header-timeout`: clients that send their headers a byte at a time get a 408
and are disconnected once the deadline passes (they cannot hold connections), while a normal
client on another connection is served meanwhile, and a keep-alive connection that sends its
next request in time is served again."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tests.server.conftest import serve_subprocess
from tests.server.tiny_folder import write_tiny_folder

SLOW_CLIENTS = 50


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setblocking(False)
    return sock


def _closed(sock: socket.socket) -> bytes | None:
    """What the server sent before closing, or None while it is open."""
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except BlockingIOError:
        return None
    except ConnectionResetError:
        pass
    return data


def test_slow_headers_get_a_408_and_are_closed(tmp_path: Path) -> None:
    folder = write_tiny_folder(tmp_path / "tiny")
    args = ["--model", str(folder), "--page-size", "4", "--header-timeout", "1.5"]
    args += ["--log-level", "warning"]
    with serve_subprocess(args) as url:
        slow = [_connect(url) for _ in range(SLOW_CLIENTS)]
        line = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "
        t0 = time.monotonic()
        sent = 0
        closed: dict[int, bytes] = {}
        while len(closed) < SLOW_CLIENTS and time.monotonic() - t0 < 20:
            for i, sock in enumerate(slow):  # a byte each, every 100 ms: never a full header
                if i in closed:
                    continue
                got = _closed(sock)
                if got is not None:
                    closed[i] = got
                    continue
                try:
                    sock.send(line[sent % len(line) : sent % len(line) + 1] or b"a")
                except (BrokenPipeError, ConnectionResetError):
                    closed[i] = b""
            sent += 1
            if sent == 5:  # meanwhile a normal client is served
                assert httpx.get(f"{url}/health", timeout=5).status_code == 200
            time.sleep(0.1)
        took = time.monotonic() - t0
        assert len(closed) == SLOW_CLIENTS, f"{SLOW_CLIENTS - len(closed)} still open"
        assert 1.0 < took < 10.0
        assert all(got.startswith(b"HTTP/1.1 408 ") for got in closed.values() if got)
        assert sum(1 for got in closed.values() if got.startswith(b"HTTP/1.1 408 ")) > 0
        for sock in slow:
            sock.close()
        with httpx.Client() as client:  # keep-alive: the next request in time is served
            for _ in range(3):
                assert client.get(f"{url}/health", timeout=5).status_code == 200
                time.sleep(0.5)
