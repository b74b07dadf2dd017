"""EngineReplica: one LLMEngine on its own engine thread, the body of the engine deployment.

Each replica loads the model, opens the shared KV tier (``kv_store``, the same Redis namespace
for every replica of one model and configuration) and runs requests the ingress sends it through
a ``DeploymentHandle``. A request's stream starts with ``{"replica": id}`` (the ingress echoes it
in a header) and continues with one :func:`pagedattn.cluster.wire.encode_output` dict per
engine output; a request the replica cannot run ends with ``{"error": {...}}``.

Every ``request_routing_stats_period_s`` Ray Serve calls :meth:`EngineReplica.record_routing_stats`;
its dict reaches the request routers of every handle: the hashes of the pages this replica's
prefix index holds (the router's facts), its number of requests, and its Prometheus text (the
ingress relabels and serves it on ``/metrics``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from pagedattn.server.engine_loop import AsyncEngine, EngineDeadError
from pagedattn.server.metrics import ServerMetrics
from pagedattn.server.model_spec import ModelSpec
from pagedattn.server.model_spec_wire import spec_to_wire
from pagedattn.server.structured import StructuredOutput

logger = logging.getLogger("pagedattn.cluster")

#: Hex digits of a page hash in the routing stats (8 bytes: enough to tell pages apart; the
#: allocator still compares token ids on every hit).
HASH_HEX = 16


def replica_id() -> str:
    """This Serve replica's unique id ("local" outside a replica)."""
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # not inside a Serve replica (a unit test)
        return "local"


class EngineReplica:
    """One engine behind the engine deployment.

    Args:
        model: a GGUF file or HF folder; None = the embedded SmolLM2.
        engine_options: :func:`pagedattn.engine.llm.engine_config` keywords (``kv_store``
            included), the same for every replica.
        model_name: the name the replica's metrics carry.
        health_stall_s: the replica is unhealthy (Ray replaces it) when requests are pending
            and its engine made no progress for this many seconds.
    """

    def __init__(
        self,
        model: str | None,
        engine_options: dict[str, Any],
        model_name: str,
        health_stall_s: float = 60.0,
    ) -> None:
        from pagedattn.engine.llm import engine_config
        from pagedattn.engine.llm_engine import LLMEngine

        self.replica_id = replica_id()
        self.engine = LLMEngine.from_config(engine_config(model, **engine_options))
        from pagedattn.engine.warm_up import warm_up  # the kernels, before the replica is ready

        warm_up(self.engine, compile_in_parallel=True)
        self.metrics = ServerMetrics(lambda: self.loop.stats, model_name)
        self.loop = AsyncEngine(self.engine, self.metrics, stall_timeout_s=health_stall_s)
        self.loop.start()
        self.spec = ModelSpec.of_engine(self.engine)
        self.structured = StructuredOutput(self.spec.tokenizer, self.spec.logits_size)
        self.namespace_hex = self.engine.namespace.hex()
        logger.info("replica %s ready (namespace %s)", self.replica_id, self.namespace_hex[:16])

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Run one wire request (see :mod:`pagedattn.cluster.wire`); yields the replica id,
        then every output, or an error dict."""
        import dataclasses

        from pagedattn.cluster.wire import decode_request, encode_output

        yield {"replica": self.replica_id}
        try:
            ids, params, specs = decode_request(request)
            processors = tuple(self.structured.compiler(s.field).processor(s) for s in specs)
            if processors:
                params = dataclasses.replace(params, logits_processors=processors)
        except ValueError as exc:
            yield {"error": {"status": 400, "message": str(exc)}}
            return
        arrival = time.monotonic() - max(0.0, float(request.get("queued_s", 0.0)))
        outputs = self.loop.generate(ids, params, str(request["request_id"]), arrival)
        try:
            async for out in outputs:
                yield encode_output(out)
        except EngineDeadError as exc:
            yield {"error": {"status": 503, "message": str(exc)}}
        except ValueError as exc:
            yield {"error": {"status": 400, "message": str(exc)}}
        except RuntimeError as exc:
            yield {"error": {"status": 500, "message": str(exc)}}
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]

    def model_spec(self) -> dict[str, Any]:
        """The served model as the ingress validates requests against it (tokenizer, chat
        template, limits), as plain data: :func:`pagedattn.server.model_spec_wire.spec_to_wire`."""
        return spec_to_wire(self.spec)

    def record_routing_stats(self) -> dict[str, Any]:
        """What the request routers see of this replica (called by Ray Serve)."""
        stats = self.loop.stats
        allocator = self.engine.cache_manager.allocator
        return {
            "replica": self.replica_id,
            "namespace": self.namespace_hex,
            "page_size": self.engine.cache_manager.page_size,
            "page_hashes": [h.hex()[:HASH_HEX] for h in allocator.cached_hashes()],
            "num_requests": int(stats.get("num_running", 0)) + int(stats.get("num_waiting", 0)),
            "healthy": self.loop.health() is None,
            "metrics": self.metrics.render().decode(),
        }

    def check_health(self) -> None:
        """Ray Serve's health check: raises when the engine thread is dead or stalled (the
        controller then replaces this replica)."""
        problem = self.loop.health()
        if problem is not None:
            raise RuntimeError(problem)

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.stop()
            self.engine.close()  # finish queued kv-store writes
