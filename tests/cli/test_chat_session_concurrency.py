"""Two `pagedattn chat --session shared` processes on one store (a folder, or one Redis as two
servers would share it): both start the new session, the first saves its turn, and the second's
save is refused with a clear error and exit code 1; the saved session keeps the first turn
(never a silent loss). A session document too large to be one is refused unread."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pagedattn.cli.chat import PROMPT_MARKER
from tests.redis_server import RedisServer

TIMEOUT_S = 180.0


class ChatProcess:
    """A `pagedattn chat` subprocess whose stdout is read on a thread."""

    def __init__(self, args: list[str]) -> None:
        cmd = [sys.executable, "-c", "from pagedattn.cli import main; main()", "chat", *args]
        env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self.out = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(4096):  # type: ignore[attr-defined]
            self.out += chunk

    def wait_for_prompts(self, count: int) -> None:
        """Until the ``>>>`` marker has been written ``count`` times (or the process ends)."""
        deadline = time.monotonic() + TIMEOUT_S
        while self.out.count(PROMPT_MARKER.encode()) < count and self.proc.poll() is None:
            assert time.monotonic() < deadline, self.out
            time.sleep(0.05)

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, str]:
        """Close stdin; (exit code, stderr)."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        with contextlib.suppress(BrokenPipeError):  # it has exited already
            self.proc.stdin.close()
        code = self.proc.wait(TIMEOUT_S)
        self._reader.join(10)
        return code, self.proc.stderr.read().decode()


@pytest.fixture(params=["folder", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "folder":
        yield str(tmp_path / "store")
        return
    server = RedisServer(tmp_path)
    try:
        yield server.url
    finally:
        server.stop()


def _saved(store: str) -> bytes | None:
    if store.startswith("redis://"):
        import redis

        value = redis.Redis.from_url(store).get("pagedattn:doc:session-shared")
        return value if isinstance(value, bytes) else None
    path = Path(store) / "documents" / "session-shared.json"
    return path.read_bytes() if path.is_file() else None


@pytest.mark.model
def test_two_chats_on_one_session_never_lose_a_turn_silently(store: str) -> None:
    args = ["--session", "shared", "--kv-store", store, "--max-tokens", "4"]
    first, second = ChatProcess(args), ChatProcess(args)
    try:
        first.wait_for_prompts(1)
        second.wait_for_prompts(1)  # both have read the (new) session
        first.say("What is the capital of France?")
        first.wait_for_prompts(2)  # its turn is answered and saved
        second.say("Name a colour.")
        code2, err2 = second.finish()
        code1, err1 = first.finish()
    finally:
        for chat in (first, second):
            if chat.proc.poll() is None:
                chat.proc.kill()
    assert code1 == 0, err1
    assert code2 == 1 and "was saved by another process" in err2, err2
    saved = _saved(store)
    assert saved is not None
    doc = json.loads(saved)
    users = [m["content"] for m in doc["messages"] if m["role"] == "user"]
    assert users == ["What is the capital of France?"]
    # a third process resumes the first's conversation and adds its turn
    third = ChatProcess(args)
    third.wait_for_prompts(1)
    third.say("Name a colour.")
    third.wait_for_prompts(2)
    code3, err3 = third.finish()
    assert code3 == 0 and "resumed session 'shared': 1 turns" in err3, err3
    doc = json.loads(_saved(store) or b"{}")
    users = [m["content"] for m in doc["messages"] if m["role"] == "user"]
    assert users == ["What is the capital of France?", "Name a colour."]


@pytest.mark.model
def test_an_oversized_session_document_is_refused_unread(store: str) -> None:
    huge = b'{"format": "pagedattn-session", "pad": "' + b"x" * (20 * 1024 * 1024) + b'"}'
    if store.startswith("redis://"):
        import redis

        redis.Redis.from_url(store).set("pagedattn:doc:session-shared", huge)
    else:
        (Path(store) / "documents").mkdir(parents=True)
        (Path(store) / "documents" / "session-shared.json").write_bytes(huge)
    chat = ChatProcess(["--session", "shared", "--kv-store", store, "--max-tokens", "4"])
    chat.say("hello")
    code, err = chat.finish()
    assert code == 1 and "than the 16777216 bytes a document may have" in err, err
    assert _saved(store) == huge  # refused, not overwritten
