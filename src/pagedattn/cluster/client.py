"""RemoteEngine: the ingress's :class:`pagedattn.server.engine_client.EngineClient`, which runs
each request on an engine replica through a ``DeploymentHandle``.

The handlers validate against the replicas' :class:`pagedattn.server.model_spec.ModelSpec`
(tokenizer, chat template, model context, page pool size; a replica sends it, the ingress
loads no model) and call :meth:`RemoteEngine.generate`, which sends the wire request with
``.options(stream=True)`` and turns the replica's stream back into :class:`RequestOutput` s.
The call starts at once, so the ingress learns the serving replica (:func:`replica_of`, the
first item of the stream) before it sends the response headers.

Failure: a replica that dies (or cannot be reached) mid-request ends the iteration with
:class:`EngineDeadError` (a 503, or a final error event in a stream), never a silent end.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pagedattn.cluster.wire import WireError, decode_output, encode_request
from pagedattn.engine.outputs import RequestOutput
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.engine_loop import EngineDeadError
from pagedattn.server.errors import APIError


@dataclass
class Routed:
    """Per HTTP request: the streams it started (set by the ingress around each handler)."""

    streams: list[RemoteStream] = field(default_factory=list)


CURRENT: contextvars.ContextVar[Routed | None] = contextvars.ContextVar(
    "pagedattn_routed", default=None
)


class RemoteStream:
    """One request's outputs from a replica (an async iterator; ``aclose`` cancels it)."""

    def __init__(
        self, responses: Any, request_id: str, live: dict[str, RemoteStream] | None = None
    ) -> None:
        self._responses = responses  # ray.serve.handle.DeploymentResponseGenerator
        self.request_id = request_id
        self.replica: str | None = None
        self._done = False
        self._live = {} if live is None else live  # the client's streams not yet ended
        self._live[request_id] = self

    def _end(self) -> None:
        self._done = True
        self._live.pop(self.request_id, None)

    def __aiter__(self) -> RemoteStream:
        return self

    async def _next_item(self) -> dict[str, Any]:
        try:
            item = await self._responses.__anext__()
        except StopAsyncIteration:
            raise
        except Exception as exc:  # the replica died, was unreachable, or raised
            self._end()
            where = f"replica {self.replica}" if self.replica else "the engine replica"
            raise EngineDeadError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(item, dict):
            raise EngineDeadError(f"the engine replica sent {type(item).__name__}, not a dict")
        return item

    async def replica_id(self) -> str:
        """The id of the replica serving this request (waits for its first item)."""
        if self.replica is None:
            item = await self._next_item()
            if "replica" not in item:
                raise EngineDeadError(f"the engine replica sent {sorted(item)} first")
            self.replica = str(item["replica"])
        return self.replica

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        await self.replica_id()
        try:
            item = await self._next_item()
        except StopAsyncIteration:
            self._end()
            raise EngineDeadError(
                f"replica {self.replica} ended the stream before the request finished"
            ) from None
        error = item.get("error")
        if error is not None:
            self._end()
            status, message = int(error["status"]), str(error["message"])
            if status == 503:
                raise EngineDeadError(message)
            if status == 400:
                raise APIError(400, message)
            raise RuntimeError(message)
        try:
            out = decode_output(item)
        except WireError as exc:
            self._end()
            raise EngineDeadError(str(exc)) from exc
        if out.finished:
            self._end()
        return out

    def cancel(self) -> None:
        """Cancel the replica call (the replica aborts the request); the stream ends."""
        if not self._done:
            self._end()
            self._responses.cancel()

    async def aclose(self) -> None:
        self.cancel()


class RemoteEngine:
    """An engine client whose requests run on the engine deployment's replicas.

    Args:
        handle: the engine deployment's ``DeploymentHandle``.
        metrics: what ``/metrics`` renders (see :mod:`pagedattn.cluster.metrics`).
    """

    def __init__(self, handle: Any, metrics: Any) -> None:
        self.handle = handle.options(stream=True, method_name="generate")
        self.metrics = metrics
        self.death: str | None = None
        self._running = False
        self._streams: dict[str, RemoteStream] = {}  # submitted, not yet ended

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def stats(self) -> dict[str, Any]:
        """Empty: the engines' counters reach ``/metrics`` through the replicas' reports."""
        return {}

    def start(self, *, after_stop: bool = False) -> None:
        self._running = True

    def stop(self, timeout_s: float = 10.0, *, then: Callable[[], None] | None = None) -> None:
        self._running = False
        if then is not None:  # the replicas run the requests: nothing runs here
            then()

    def health(self) -> str | None:
        return None if self._running else "the ingress is not running"

    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Send the request to a replica now; the returned stream yields its outputs.

        Raises:
            EngineDeadError: the client is stopped.
            APIError: 400 when the request cannot be sent (a custom logits processor).
        """
        if not self._running:
            raise EngineDeadError("the ingress is not running")
        queued_s = 0.0 if arrival_time is None else time.monotonic() - arrival_time
        try:
            wire = encode_request(prompt_token_ids, params, request_id, queued_s)
        except WireError as exc:
            raise APIError(400, str(exc)) from exc
        stream = RemoteStream(self.handle.remote(wire), request_id, self._streams)
        routed = CURRENT.get()
        if routed is not None:
            routed.streams.append(stream)
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request's replica call (the replica aborts it and frees its pages); its
        stream ends. No-op when unknown or ended."""
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.cancel()
