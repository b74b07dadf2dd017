"""EngineClient: what the HTTP handlers need from the engine loop they serve through.

:class:`pagedattn.server.engine_loop.AsyncEngine` (the engine on a thread of this process) is
one; a client that runs requests elsewhere (another process, another machine) is another. The
handlers validate against ``engine`` (its tokenizer, chat template, model context and page pool
size) and run every request through :meth:`EngineClient.generate`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.engine.outputs import RequestOutput
from pagedattn.sampling_params import SamplingParams


class EngineClient(Protocol):
    """The engine loop as the handlers see it.

    Attributes:
        engine: the engine requests are validated against (tokenizer, limits); a remote
            client's local copy is never stepped.
        metrics: the registry rejections are counted in (``count_rejection``) and ``/metrics``
            renders (``render``), or None.
        death: why the loop is not running, or None.
    """

    engine: LLMEngine
    metrics: Any
    death: str | None

    @property
    def is_running(self) -> bool:
        """True while requests can be submitted."""

    @property
    def stats(self) -> dict[str, Any]:
        """The engine's latest ``get_stats()``."""

    def start(self, *, after_stop: bool = False) -> None:
        """Start the loop (idempotent)."""

    def stop(self, timeout_s: float = 10.0, *, then: Callable[[], None] | None = None) -> None:
        """Stop the loop, aborting what runs; ``then`` runs once nothing runs any more."""

    def health(self) -> str | None:
        """None when healthy, else why not."""

    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Run one request; yields its outputs until the finished one. Leaving the iteration
        early aborts it. Raises EngineDeadError when the engine cannot run it."""
