"""OpenAI-style errors: every failure is ``{"error": {"message", "type", "param", "code"}}``.

FastAPI's defaults are replaced: a request body that is not JSON or does not match the
protocol models is a 400 (not 422), a body over the server's size limit a 413, HTTP errors keep
their status with the OpenAI body, and any unexpected exception is a 500 with the same shape
(the engine loop is unaffected: it runs in its own thread and only ever sees validated
requests). An unexpected exception is answered by :class:`UnexpectedErrors`, which logs it
once, counts it and keeps the client's keep-alive connection open (Starlette's own handler
re-raises it to the ASGI server, which then closes the connection).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedattn.server.protocol import ErrorBody, ErrorResponse, dump
from pagedattn.server.request_base import LONE_SURROGATE

logger = logging.getLogger("pagedattn.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error to send to the client.

    Args:
        status: HTTP status code (400, 401, 404, 500...).
        message: human-readable reason.
        param: the request field at fault, or None.
        code: a machine-readable code (``"model_not_found"``, ``"context_length_exceeded"``...).
    """

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The JSON body of an error with this HTTP status."""
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return dump(ErrorResponse(error=ErrorBody(message=message, type=kind, param=param, code=code)))


def error_response(exc: APIError) -> JSONResponse:
    """A JSONResponse for an :class:`APIError`."""
    return JSONResponse(
        error_body(exc.status, exc.message, exc.param, exc.code), status_code=exc.status
    )


def value_error(exc: ValueError) -> APIError:
    """A 400 from a ValueError whose message starts with ``"<field>: "`` (SamplingParams, the
    engine's prompt checks); the field becomes ``param``."""
    message = str(exc)
    head, sep, _ = message.partition(":")
    param = head if sep and head.isidentifier() else None
    return APIError(400, message, param=param)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if loc and loc[0][:1].isupper() and loc[0].isidentifier():
        loc = loc[1:]  # the model of a union body (``/tokenize``): fields are snake_case
    if first.get("type") == "json_invalid":
        return f"invalid JSON body: {first.get('msg', '')}", None
    if first.get("type") == LONE_SURROGATE:  # the path is in the message, the field in ctx
        field = (first.get("ctx") or {}).get("field")
        return str(first.get("msg", "lone surrogate")), (loc[0] if loc else field)
    where = ".".join(loc) or "body"
    return f"{where}: {first.get('msg', 'invalid value')}", (loc[0] if loc else None)


def unexpected_error_body(exc: BaseException) -> dict[str, Any]:
    """The 500 body of an exception nothing expected."""
    return error_body(500, f"internal error: {type(exc).__name__}: {exc}")


class UnexpectedErrors:
    """ASGI middleware: an exception escaping a route becomes a 500 with the OpenAI body, is
    logged once and reported to ``on_error``, and does not reach the ASGI server, so the
    connection stays open for the client's next request. An exception after the response
    started (a streamed body) is re-raised: that response cannot be completed.

    Args:
        app: the wrapped application.
        on_error: called with every unexpected exception (e.g. a Prometheus counter).
    """

    def __init__(self, app: ASGIApp, on_error: Callable[[BaseException], None]) -> None:
        self.app = app
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            logger.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            self.on_error(exc)
            if started:
                raise
            response = JSONResponse(unexpected_error_body(exc), status_code=500)
            await response(scope, receive, send)


def install_error_handlers(app: FastAPI, on_unexpected: Callable[[BaseException], None]) -> None:
    """Register the OpenAI-shaped handlers on ``app``.

    Args:
        on_unexpected: called with every unexpected exception (see :class:`UnexpectedErrors`).
    """

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_message(exc)
        return JSONResponse(error_body(400, message, param), status_code=400)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = "request_too_large" if exc.status_code == 413 else None
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail), code=code),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_middleware(UnexpectedErrors, on_error=on_unexpected)
