"""The FastAPI application: OpenAI-compatible routes, health, Prometheus metrics.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON, or
server-sent events ending in ``data: [DONE]`` when ``stream`` is true), ``POST /v1/responses``
(OpenAI's Responses API for text, :mod:`pagedattn.server.responses_api`), ``GET /health`` and
``GET /metrics``, and vLLM's ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``
and ``GET /version`` (:mod:`pagedattn.server.tokenize`), ``POST /invocations``, ``/ping`` and
``GET /load`` (:mod:`pagedattn.server.vllm_routes`), ``GET /v1/kv/state`` (the KV cache as ids
and counts, :mod:`pagedattn.server.kv_state`) and, unless turned off, the browser pages ``/``
(chat) and ``/kv`` (:mod:`pagedattn.server.webui`). With an API key every route but
``/health``, ``/ping``, ``/version`` and the pages' static files needs
``Authorization: Bearer <key>`` (401 with an OpenAI error body otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import pagedattn.server.protocol as p
from pagedattn.server.body_limit import BodyLimit
from pagedattn.server.engine_client import EngineClient
from pagedattn.server.engine_loop import AsyncEngine
from pagedattn.server.errors import APIError, error_body, install_error_handlers
from pagedattn.server.kv_history import CounterHistory
from pagedattn.server.kv_state import add_kv_state_route
from pagedattn.server.metrics import ServerMetrics
from pagedattn.server.model_spec import ModelSpec
from pagedattn.server.responses_api import ResponsesRequest
from pagedattn.server.responses_stream import ResponsesServing
from pagedattn.server.serving import OpenAIServing
from pagedattn.server.tokenize import add_tokenizer_routes, package_version
from pagedattn.server.vllm_routes import ServerLoad, add_vllm_routes
from pagedattn.server.webui import add_webui

if TYPE_CHECKING:
    from pagedattn.engine.llm_engine import LLMEngine

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024  # 4 MiB
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": p.ErrorResponse},
    401: {"model": p.ErrorResponse},
    404: {"model": p.ErrorResponse},
    413: {"model": p.ErrorResponse},
    500: {"model": p.ErrorResponse},
    503: {"model": p.ErrorResponse},
}


def create_app(
    engine: LLMEngine,
    *,
    model_name: str | Sequence[str],
    health_stall_s: float = 60.0,
    **options: Any,
) -> FastAPI:
    """Build the app around ``engine``, run on a thread of this process (an
    :class:`AsyncEngine`); the thread starts with the app (or at the first request when the
    ASGI server runs no lifespan) and stops at shutdown; it is never restarted (a dead engine
    makes ``/health`` and every request a 503).

    Args:
        engine: the engine to serve; from now on only the engine thread may touch it.
        model_name: see :func:`create_client_app`.
        health_stall_s: ``/health`` is a 503 when requests are pending and the engine made
            no progress for this many seconds.
        options: the other keywords of :func:`create_client_app`.
    """
    names = _names(model_name)
    metrics = ServerMetrics(lambda: client.stats, names[0])
    spec = ModelSpec.of_engine(engine)  # read before the engine thread owns the engine
    client = AsyncEngine(engine, metrics, stall_timeout_s=health_stall_s)
    return create_client_app(
        client, spec, model_name=names, metrics=metrics, close=engine.close, **options
    )


def _names(model_name: str | Sequence[str]) -> list[str]:
    names = [model_name] if isinstance(model_name, str) else list(model_name)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"model_name: expected one or more non-empty names, got {model_name!r}")
    return names


def create_client_app(
    async_engine: EngineClient,
    spec: ModelSpec,
    *,
    model_name: str | Sequence[str],
    metrics: Any = None,
    close: Callable[[], None] | None = None,
    api_key: str | None = None,
    default_max_tokens: int = 1024,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_logprobs: int = 20,
    enable_server_load_tracking: bool = False,
    webui: bool = True,
    max_seqs_per_request: int | None = None,
) -> FastAPI:
    """Build the app: requests are validated against ``spec`` and run through
    ``async_engine``, which starts with the app and stops at shutdown.

    Args:
        async_engine: the engine client requests run through.
        spec: the served model (tokenizer, chat template, vocabulary, limits).
        model_name: the name clients pass as ``model`` (and ``/v1/models`` lists), or several
            names for the one model (the first one labels the metrics).
        metrics: what ``/metrics`` renders and rejections are counted in; None =
            ``async_engine.metrics``.
        close: runs once the client has stopped at shutdown (e.g. ``LLMEngine.close``).
        api_key: when set, the Bearer token every route but ``/health`` requires.
        default_max_tokens: cap on the chat default ``max_tokens`` (see
            :mod:`pagedattn.server.serving`).
        max_request_bytes: the largest request body; a larger one is a 413, refused as soon
            as its ``Content-Length`` or the bytes read so far pass the limit (the body is
            read in the ASGI server's chunks and never held whole).
        max_logprobs: the most logprobs per position a request may ask for (vLLM's
            ``--max-logprobs``); -1 = the whole vocabulary (what ``-1`` in a request asks).
        enable_server_load_tracking: ``GET /load`` counts the generation requests in flight.
        webui: serve the chat page at ``/`` and the KV-cache page at ``/kv``.
        max_seqs_per_request: most prompts x ``n`` one request may ask for (a 400 naming ``n``
            or ``prompt`` past it); None = four times the engine's ``max_num_seqs``.

    Returns:
        The app; ``app.state.async_engine`` and ``app.state.metrics`` give the engine client
        and the metrics registry, ``app.state.serving.spec`` the served model.
    """
    names = _names(model_name)
    metrics = async_engine.metrics if metrics is None else metrics
    if metrics is None:
        raise ValueError("metrics: the engine client has none; pass the registry to render")
    if max_logprobs < -1:
        raise ValueError(f"max_logprobs: expected -1 or an int >= 0, got {max_logprobs}")
    serving = OpenAIServing(
        async_engine,
        spec,
        names[0],
        default_max_tokens,
        names[1:],
        max_logprobs,
        max_seqs_per_request,
    )
    load = ServerLoad(enable_server_load_tracking)
    history = CounterHistory(lambda: async_engine.stats)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async_engine.start(after_stop=True)
        sampler = asyncio.create_task(history.run())
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            # e.g. finish queued kv-store writes once the engine thread has stopped (not
            # mid-step)
            async_engine.stop(then=close)

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

    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes: expected >= 1, got {max_request_bytes}")
    app = FastAPI(title="pagedattn", version=package_version(), lifespan=lifespan)
    app.state.async_engine = async_engine
    app.state.serving = serving
    app.state.metrics = metrics
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    install_error_handlers(app, metrics.count_unexpected)  # outside BodyLimit
    auth = [Depends(check_api_key)]

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the engine thread runs and makes progress; 503 when it is dead or made
        no progress for ``health_stall_s`` with requests pending. Never starts anything."""
        problem = async_engine.health()
        if problem is not None:
            body = error_body(503, problem, code="engine_unavailable")
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", dependencies=auth)
    async def get_metrics() -> Response:
        """Prometheus text exposition of this server's registry."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=auth, response_model=p.ModelList, responses=_ERRORS)
    async def list_models() -> p.ModelList:
        """The served model, once per name."""
        created = p.now_s()
        served = serving.served
        cards = [
            p.ModelCard(id=name, created=created, max_model_len=served.max_model_len)
            for name in served.names
        ]
        return p.ModelList(data=cards)

    @app.post("/v1/completions", dependencies=auth, response_model=p.Completion, responses=_ERRORS)
    async def completions(request: p.CompletionRequest, raw: Request) -> Response:
        """OpenAI text completions."""
        return await load.track(serving.respond(raw, request))

    @app.post(
        "/v1/chat/completions",
        dependencies=auth,
        response_model=p.ChatCompletion,
        responses=_ERRORS,
    )
    async def chat_completions(request: p.ChatCompletionRequest, raw: Request) -> Response:
        """OpenAI chat completions (the model's chat template renders the conversation)."""
        return await load.track(serving.respond(raw, request))

    responses = ResponsesServing(serving)

    @app.post("/v1/responses", dependencies=auth, response_model=None, responses=_ERRORS)
    async def create_response(request: ResponsesRequest, raw: Request) -> Response:
        """OpenAI Responses API: text in, text out (:mod:`pagedattn.server.responses_api`)."""
        return await load.track(responses.respond(raw, request))

    add_tokenizer_routes(app, serving.served, serving.prepare.limits, auth, _ERRORS)
    add_vllm_routes(app, chat_completions, completions, load, auth, _ERRORS, health)
    add_kv_state_route(app, async_engine, names[0], history, auth, _ERRORS)
    if webui:
        add_webui(app)
    return app


def default_served_names(model: str | None) -> list[str]:
    """The names a server answers to when it is given none: the file or folder name without
    extension; for the embedded model (``model`` None) ``SmolLM2-135M-Instruct`` and the name
    ``pagedattn models`` lists it under (``smollm2-135m``)."""
    from pathlib import Path

    from pagedattn.model.catalogue_entries import DEFAULT_NAME
    from pagedattn.model.registry import DEFAULT_MODEL

    if model is None:
        return [DEFAULT_MODEL.name, DEFAULT_NAME]
    return [Path(model).name.removesuffix(".gguf")]


def build_app(
    model: str | None = None,
    *,
    served_model_name: str | Sequence[str] | None = None,
    api_key: str | None = None,
    default_max_tokens: int = 1024,
    health_stall_s: float = 60.0,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_logprobs: int = 20,
    enable_server_load_tracking: bool = False,
    webui: bool = True,
    max_seqs_per_request: int | None = None,
    **engine_options: Any,
) -> FastAPI:
    """Load a model, compile or load the kernels its requests run
    (:func:`pagedattn.engine.warm_up.warm_up`), and build its app (what ``pagedattn serve``
    runs: it answers ``/health`` and ``/v1/models`` once this returned).

    Args:
        model: a GGUF file or Hugging Face folder; None = the embedded SmolLM2.
        served_model_name: the name (or names) clients use; None or empty =
            :func:`default_served_names`.
        api_key, default_max_tokens, health_stall_s, max_request_bytes, max_logprobs,
        enable_server_load_tracking, webui, max_seqs_per_request: see :func:`create_app`.
        engine_options: engine options (see :func:`pagedattn.engine.llm.engine_config`).

    Raises:
        FileNotFoundError, ValueError: from the loader or the engine configuration.
        pagedattn.engine.warm_up.WarmUpError: the engine cannot run a request.
    """
    from pagedattn.engine.llm import engine_config
    from pagedattn.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_config(engine_config(model, **engine_options))
    # compile or load every kernel a request runs before the server answers anything
    from pagedattn.engine.warm_up import warm_up

    warm_up(engine, compile_in_parallel=True)
    if not served_model_name:
        served_model_name = default_served_names(model)
    app = create_app(
        engine,
        model_name=served_model_name,
        api_key=api_key,
        default_max_tokens=default_max_tokens,
        health_stall_s=health_stall_s,
        max_request_bytes=max_request_bytes,
        max_logprobs=max_logprobs,
        enable_server_load_tracking=enable_server_load_tracking,
        webui=webui,
        max_seqs_per_request=max_seqs_per_request,
    )
    app.state.serving.structured.warm_up()  # the grammar compiler every chat request reads
    return app
