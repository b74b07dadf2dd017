"""OpenAI-style errors: every failure is ``{"error": {"message", "type", "param", "code"}}``.

FastAPI's defaults are replaced: a request body that is not JSON or does not match the
protocol models is a 400 (not 422), HTTP errors keep their status with the OpenAI body, and any
unexpected exception is a 500 with the same shape (the engine loop is unaffected: it runs in
its own thread and only ever sees validated requests).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedattn.server.protocol import ErrorBody, ErrorResponse, dump

logger = logging.getLogger("pagedattn.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
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
    if first.get("type") == "json_invalid":
        return f"invalid JSON body: {first.get('msg', '')}", None
    where = ".".join(loc) or "body"
    return f"{where}: {first.get('msg', 'invalid value')}", (loc[0] if loc else None)


def install_error_handlers(app: FastAPI) -> None:
    """Register the OpenAI-shaped handlers on ``app``."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_message(exc)
        return JSONResponse(error_body(400, message, param), status_code=400)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        body = error_body(500, f"internal error: {type(exc).__name__}: {exc}")
        return JSONResponse(body, status_code=500)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
