"""vLLM's server routes beyond OpenAI's: ``POST /invocations``, ``GET|POST /ping`` and
``GET /load``.

- ``POST /invocations``: the SageMaker entry point. The body is answered as the route it fits,
  tried in vLLM's order: a chat completion (it has ``messages``), else a completion (it has
  ``prompt``); a body that fits neither is a 400 naming the field of the first failing check
  (``messages`` when the body has them, else ``prompt``).
- ``GET /ping`` and ``POST /ping``: SageMaker's health check, answered as ``GET /health``
  (no API key, as ``/health``).
- ``GET /load``: ``{"server_load": N}``, the generation requests in flight (from arrival until
  their last byte is sent: streams count until they end). It counts only with
  ``enable_server_load_tracking`` (``serve --enable-server-load-tracking``), else it stays 0,
  as in vLLM.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

import pagedattn.server.protocol as p
from pagedattn.server.errors import APIError

Handler = Callable[[Any, Request], Awaitable[Response]]


class ServerLoad:
    """The count ``GET /load`` reports (see the module docstring)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.value = 0

    def _done(self) -> None:
        self.value -= 1

    async def track(self, call: Awaitable[Response]) -> Response:
        """``call``'s response, counted from now until it is sent (or fails)."""
        if not self.enabled:
            return await call
        self.value += 1
        try:
            response = await call
        except BaseException:
            self._done()
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._counted(response.body_iterator)
        elif response.background is None:
            response.background = BackgroundTask(self._done)
        else:  # not made by the handlers: count it as sent
            self._done()
        return response

    async def _counted(self, body: AsyncIterable[Any]) -> AsyncIterator[Any]:
        try:
            async for part in body:
                yield part
        finally:
            self._done()
            close = getattr(body, "aclose", None)
            if close is not None:
                await close()


def add_vllm_routes(
    app: FastAPI,
    chat: Handler,
    completion: Handler,
    load: ServerLoad,
    dependencies: list[Any],
    responses: dict[int | str, dict[str, Any]],
    health: Callable[[], Awaitable[JSONResponse]],
) -> None:
    """Add ``POST /invocations`` (answered by ``chat`` or ``completion``), ``/ping``
    (answered by ``health``) and ``GET /load``."""

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> JSONResponse:
        """SageMaker's health check: ``GET /health``'s answer."""
        return await health()

    @app.post("/invocations", dependencies=dependencies, response_model=None, responses=responses)
    async def invocations(raw: Request) -> Response:
        """SageMaker's entry point: a chat completion or a completion, by the body's shape."""
        try:
            body = await raw.json()
        except ValueError as exc:
            raise APIError(400, f"invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise APIError(400, "expected a JSON object: a chat completion or a completion")
        failures: list[pydantic.ValidationError] = []
        for model, handler in ((p.ChatCompletionRequest, chat), (p.CompletionRequest, completion)):
            try:
                request = model.model_validate(body)
            except pydantic.ValidationError as exc:
                failures.append(exc)
                continue
            return await handler(request, raw)
        if "messages" in body or "prompt" in body:
            failure = failures[0] if "messages" in body else failures[1]
            raise RequestValidationError(failure.errors())
        raise APIError(
            400,
            "Cannot find a suitable handler for the request: expected a chat completion "
            "(messages) or a completion (prompt)",
            param="messages",
        )

    @app.get("/load", dependencies=dependencies)
    async def server_load() -> JSONResponse:
        """The generation requests in flight (0 unless load tracking is on)."""
        return JSONResponse({"server_load": load.value})
