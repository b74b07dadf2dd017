"""A header-read timeout for uvicorn's HTTP/1.1 protocol (h11), which has none of its own.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but a client that
connects and then sends its request line and headers a byte at a time holds a connection (and
its buffers) for as long as it likes; a thousand such clients hold a thousand. The protocol of
:func:`header_timeout_protocol` starts a deadline when a connection opens, and again when a
keep-alive connection starts its next request: the request's headers must be complete by then,
else the server answers ``408 Request Timeout`` and closes the connection (what nginx's
``client_header_timeout`` does). The body and the response are not under this deadline (the
body size is bounded by the app, :mod:`pagedattn.server.body_limit`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a client has to send a request's line and headers (``--header-timeout``).
DEFAULT_HEADER_TIMEOUT_S = 10.0
_REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


def header_timeout_protocol(timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a ``timeout_s`` header-read deadline (pass it as
    ``uvicorn.run(..., http=...)``).

    Raises:
        ValueError: ``timeout_s`` <= 0.
    """
    if not timeout_s > 0:
        raise ValueError(f"header_timeout_s: expected > 0, got {timeout_s!r}")

    class HeaderTimeoutH11Protocol(H11Protocol):
        header_timeout_s = float(timeout_s)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self._arm()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the headers are in
                self._disarm()

        def _arm(self) -> None:
            idle = self.conn.their_state is h11.IDLE
            if self._header_deadline is None and idle and not self.transport.is_closing():
                self._header_deadline = self.loop.call_later(self.header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _expired(self) -> None:
            self._header_deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                if self.cycle is None or self.cycle.response_complete:
                    self.transport.write(_REQUEST_TIMEOUT)
                self.transport.close()

    return HeaderTimeoutH11Protocol
