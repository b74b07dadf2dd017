"""ClusterIngress: the OpenAI-compatible HTTP deployment in front of the engine replicas.

It serves the very app ``pagedattn serve`` serves (:func:`pagedattn.server.app.create_app`:
the same routes, request models, validation, errors, SSE and structured output), with a
:class:`pagedattn.cluster.client.RemoteEngine` as its engine loop, so every request runs on an
engine replica chosen by the engine deployment's request router. Each response that ran on a
replica names it in the ``x-pagedattn-replica`` header.

The ingress has no model: it validates requests against the
:class:`pagedattn.server.model_spec.ModelSpec` an engine replica sends it when it starts
(tokenizer, chat template, limits; plain data, :mod:`pagedattn.server.model_spec_wire`). It
loads no weights and imports no model-forward or kernel code.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedattn.cluster.client import CURRENT, RemoteEngine, Routed
from pagedattn.cluster.metrics import ClusterMetrics, router_sources
from pagedattn.server.app import DEFAULT_MAX_REQUEST_BYTES
from pagedattn.server.engine_loop import EngineDeadError
from pagedattn.server.model_spec_wire import spec_from_wire

REPLICA_HEADER = "x-pagedattn-replica"


class ReplicaHeader:
    """ASGI middleware: collects the replica streams a request starts (``CURRENT``) and puts
    the serving replica's id in the response headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        routed = Routed()
        token = CURRENT.set(routed)

        async def send_with_replica(message: Message) -> None:
            if message["type"] == "http.response.start" and routed.streams:
                try:
                    replica = await routed.streams[-1].replica_id()
                except EngineDeadError:
                    replica = None  # the body reports the failure
                if replica is not None:
                    headers = [
                        *message.get("headers", []),
                        (REPLICA_HEADER.encode(), replica.encode()),
                    ]
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_replica)
        finally:
            CURRENT.reset(token)


class ClusterIngress:
    """The ingress deployment's body (see :func:`pagedattn.cluster.app.build_cluster_app`).

    Args:
        engine_handle: the engine deployment's handle.
        engine_deployment: that deployment's name (its router's counters feed ``/metrics``).
        served_model_name: names clients may pass as ``model``.
        api_key, default_max_tokens, max_request_bytes, webui: see
            :func:`pagedattn.server.app.create_app`.
    """

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        engine_handle: Any,
        engine_deployment: str,
        served_model_name: list[str],
        api_key: str | None = None,
        default_max_tokens: int = 1024,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        webui: bool = True,
    ) -> None:
        from pagedattn.server.app import create_client_app

        # the replicas describe their model (EngineReplica.model_spec): no model is loaded
        # here; this waits for the first replica to be ready
        spec = spec_from_wire(await engine_handle.options(method_name="model_spec").remote())
        metrics = ClusterMetrics(router_sources(engine_deployment))
        self.client = RemoteEngine(engine_handle, metrics)
        app = create_client_app(
            self.client,
            spec,
            model_name=served_model_name,
            api_key=api_key,
            default_max_tokens=default_max_tokens,
            max_request_bytes=max_request_bytes,
            webui=webui,
        )
        app.add_middleware(ReplicaHeader)
        self._asgi_app = app

    def __serve_build_asgi_app__(self) -> Any:
        return self._asgi_app
