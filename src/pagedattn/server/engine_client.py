"""EngineClient: what the HTTP handlers need from the engine they serve through.

:class:`pagedattn.server.engine_loop.AsyncEngine` (the engine on a thread of this process) is
one; :class:`pagedattn.cluster.client.RemoteEngine` (requests run on engine replicas) is
another. The handlers never see an engine: they validate requests against the served model's
:class:`pagedattn.server.model_spec.ModelSpec` (tokenizer, chat template, limits), run them
through :meth:`EngineClient.generate` and read :attr:`EngineClient.stats` and
:meth:`EngineClient.health`. A client that can snapshot its KV cache between two steps also
has ``kv_snapshot`` (:class:`pagedattn.server.kv_state.KVSnapshots`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from pagedattn.engine.outputs import RequestOutput
from pagedattn.sampling_params import SamplingParams


class EngineClient(Protocol):
    """The engine as the handlers see it.

    Attributes:
        metrics: the registry rejections are counted in (``count_rejection``) and ``/metrics``
            renders (``render``), or None.
        death: why the client cannot run requests any more, or None.
    """

    metrics: Any
    death: str | None

    @property
    def is_running(self) -> bool:
        """True while requests can be submitted."""

    @property
    def stats(self) -> dict[str, Any]:
        """The engine's latest ``get_stats()`` (empty when the engine runs elsewhere)."""

    def start(self, *, after_stop: bool = False) -> None:
        """Start serving (idempotent)."""

    def stop(self, timeout_s: float = 10.0, *, then: Callable[[], None] | None = None) -> None:
        """Stop serving, aborting what runs; ``then`` runs once nothing runs any more."""

    def health(self) -> str | None:
        """None when healthy, else why not."""

    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Submit one request; the stream yields its outputs until the finished one. Leaving
        the iteration early aborts it. Raises EngineDeadError when the engine cannot run it."""

    def abort(self, request_id: str) -> None:
        """Abort a submitted request (no-op when unknown or finished): the engine stops it
        and frees its pages."""
