"""A private redis-server on a free loopback port (no persistence), for the storage and server
tests, which also kill, pause and restart it to inject faults, and for the benchmarks that need
a Redis of their own (benchmarks/online/compare.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process: loopback only, no persistence, DEBUG enabled; started by
    the constructor, on the same port by every later :meth:`start`.

    Args:
        workdir: its working directory (default: a fresh temporary one, removed by
            :meth:`stop`).
        maxmemory: e.g. ``"2mb"`` with ``allkeys-lru`` eviction; None is unlimited.

    Raises:
        FileNotFoundError: redis-server is not installed.
        OSError: it did not answer PING within 10 s.
    """

    def __init__(self, workdir: Path | None = None, maxmemory: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (make redis installs it)")
        self.binary = binary
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="pagedattn-redis-"))
        self.maxmemory = maxmemory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the process and wait until it answers PING (10 s at most)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--enable-debug-command", "yes",
        ]  # fmt: skip
        if self.maxmemory is not None:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self._pong():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise OSError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server (its data is gone: no persistence)."""
        if self.proc is not None:
            self.resume()
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel but nothing is answered."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Terminate the server and wait for it (SIGKILL after 5 s)."""
        if self.proc is not None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
