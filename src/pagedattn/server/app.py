"""The FastAPI application: OpenAI-compatible routes, health, Prometheus metrics.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON, or
server-sent events ending in ``data: [DONE]`` when ``stream`` is true), ``GET /health`` and
``GET /metrics``. With an API key every route but ``/health`` needs
``Authorization: Bearer <key>`` (401 with an OpenAI error body otherwise).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.server import protocol as p
from pagedattn.server.engine_loop import AsyncEngine
from pagedattn.server.errors import APIError, error_body, install_error_handlers
from pagedattn.server.metrics import ServerMetrics
from pagedattn.server.serving import OpenAIServing

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": p.ErrorResponse},
    401: {"model": p.ErrorResponse},
    404: {"model": p.ErrorResponse},
    500: {"model": p.ErrorResponse},
}


def create_app(
    engine: LLMEngine,
    *,
    model_name: str,
    api_key: str | None = None,
    default_max_tokens: int = 1024,
) -> FastAPI:
    """Build the app around ``engine``; its engine thread starts with the app (or at the first
    request when the ASGI server runs no lifespan) and stops at shutdown.

    Args:
        engine: the engine to serve; from now on only the engine thread may touch it.
        model_name: the name clients pass as ``model`` (and ``/v1/models`` lists).
        api_key: when set, the Bearer token every route but ``/health`` requires.
        default_max_tokens: cap on the chat default ``max_tokens`` (see
            :mod:`pagedattn.server.serving`).

    Returns:
        The app; ``app.state.async_engine`` and ``app.state.metrics`` give the engine loop and
        the metrics registry.
    """
    metrics = ServerMetrics(lambda: async_engine.stats, model_name)
    metrics.instrument(engine)
    async_engine = AsyncEngine(engine, metrics)
    serving = OpenAIServing(async_engine, model_name, default_max_tokens)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        try:
            yield
        finally:
            async_engine.stop()

    async def check_api_key(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
            token.strip().encode(), api_key.encode()
        ):
            raise APIError(
                401,
                "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
            )

    app = FastAPI(title="pagedattn", version="0.1.0", lifespan=lifespan)
    app.state.async_engine = async_engine
    app.state.metrics = metrics
    install_error_handlers(app)
    auth = [Depends(check_api_key)]

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the engine thread runs, 503 otherwise."""
        async_engine.start()
        if not async_engine.is_running:
            return JSONResponse(error_body(503, "engine loop is not running"), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", dependencies=auth)
    async def get_metrics() -> Response:
        """Prometheus text exposition of this server's registry."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=auth, response_model=p.ModelList, responses=_ERRORS)
    async def list_models() -> p.ModelList:
        """The one served model."""
        card = p.ModelCard(id=model_name, created=p.now_s(), max_model_len=serving.max_model_len)
        return p.ModelList(data=[card])

    @app.post("/v1/completions", dependencies=auth, response_model=p.Completion, responses=_ERRORS)
    async def completions(
        request: p.CompletionRequest, raw: Request
    ) -> JSONResponse | StreamingResponse:
        """OpenAI text completions."""
        return await serving.respond(raw, request)

    @app.post(
        "/v1/chat/completions",
        dependencies=auth,
        response_model=p.ChatCompletion,
        responses=_ERRORS,
    )
    async def chat_completions(
        request: p.ChatCompletionRequest, raw: Request
    ) -> JSONResponse | StreamingResponse:
        """OpenAI chat completions (the model's chat template renders the conversation)."""
        return await serving.respond(raw, request)

    return app


def build_app(
    model: str | None = None,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    default_max_tokens: int = 1024,
    **engine_options: Any,
) -> FastAPI:
    """Load a model and build its app (what ``pagedattn serve`` runs).

    Args:
        model: a GGUF file or Hugging Face folder; None = the embedded SmolLM2.
        served_model_name: the name clients use; None = the file or folder name without
            extension (the embedded model: ``SmolLM2-135M-Instruct``).
        api_key, default_max_tokens: see :func:`create_app`.
        engine_options: engine options (see :func:`pagedattn.engine.llm.engine_config`).

    Raises:
        FileNotFoundError, ValueError: from the loader or the engine configuration.
    """
    from pathlib import Path

    from pagedattn.engine.llm import engine_config

    engine = LLMEngine.from_config(engine_config(model, **engine_options))
    if served_model_name is None:
        served_model_name = (
            "SmolLM2-135M-Instruct" if model is None else Path(model).name.removesuffix(".gguf")
        )
    return create_app(
        engine,
        model_name=served_model_name,
        api_key=api_key,
        default_max_tokens=default_max_tokens,
    )
