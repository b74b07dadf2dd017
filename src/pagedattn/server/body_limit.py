"""A bound on the request body: a larger one is a 413 with the OpenAI error body.

The body is counted as the ASGI server delivers it (in its chunks, under its flow control), so
a client sending 50 MB costs the server no more than the limit: a ``Content-Length`` over the
limit is refused before any of the body is read, and a chunked body as soon as the bytes read
so far pass the limit. The connection stays open for the client's next request (the ASGI
server discards what it does not read).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedattn.server.errors import error_body


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once the body passes the limit (an HTTPException, so the
    framework's body reader hands it to the 413 handler instead of calling it a bad body)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, too_large_message(max_bytes))


def too_large_message(max_bytes: int) -> str:
    """The 413 message of a body over ``max_bytes``."""
    return f"the request body is larger than this server's limit of {max_bytes} bytes"


def too_large_response(max_bytes: int) -> JSONResponse:
    """The 413 response of a body over ``max_bytes``."""
    body = error_body(413, too_large_message(max_bytes), code="request_too_large")
    return JSONResponse(body, status_code=413)


class BodyLimit:
    """ASGI middleware refusing request bodies over ``max_bytes`` (see the module docstring).

    Args:
        app: the wrapped application.
        max_bytes: the largest body accepted.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_request_bytes: expected >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
            await too_large_response(self.max_bytes)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited, send)
