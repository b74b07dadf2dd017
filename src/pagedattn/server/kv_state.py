"""``GET /v1/kv/state``: the engine's page pool, running page tables and cache counters.

The engine thread takes the snapshot between two steps (``AsyncEngine.kv_snapshot``). Every
caller gets a snapshot asked for after it arrived (what finished before the call shows), and
callers share them: one asked for while others waited serves them all, and the engine takes at
most one every :data:`MIN_SNAPSHOT_INTERVAL_S` (callers wait for the next instead), however
many pages poll. A caller waits at most :data:`SNAPSHOT_TIMEOUT_S` in all (a 503 after that,
e.g. behind a long step), and gets an answer whose size is bounded
by the query's limits whatever the pool holds: cells aggregate several pages past
``max_cells``, at most ``max_requests`` rows of at most ``max_pages_per_request`` entries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Annotated, Any, Protocol, runtime_checkable

from fastapi import FastAPI, Query
from fastapi.params import Depends

from pagedattn.cache.pool_snapshot import PAGE_STATES, PoolSnapshot, TableSnapshot
from pagedattn.server.engine_loop import EngineDeadError
from pagedattn.server.errors import APIError
from pagedattn.server.kv_cells import page_cells
from pagedattn.server.kv_history import CounterHistory, page_counters
from pagedattn.server.kv_state_models import (
    STATE_LETTERS,
    KVCounters,
    KVGroup,
    KVPageCounts,
    KVRequest,
    KVState,
    KVTable,
    KVTierCounters,
)

MIN_SNAPSHOT_INTERVAL_S = 0.25
SNAPSHOT_TIMEOUT_S = 5.0
_LETTERS = [STATE_LETTERS[name] for name in PAGE_STATES]


@runtime_checkable
class KVSnapshots(Protocol):
    """An engine loop that can snapshot its engine's KV cache (the in-process one)."""

    def kv_snapshot(self) -> Any:
        """A ``concurrent.futures.Future`` of ``LLMEngine.kv_snapshot()``."""


class SnapshotReader:
    """Shares engine snapshots between callers; the engine takes at most one per
    ``min_interval_s``, and each caller gets one asked for after it arrived."""

    def __init__(
        self,
        client: KVSnapshots,
        min_interval_s: float = MIN_SNAPSHOT_INTERVAL_S,
        timeout_s: float = SNAPSHOT_TIMEOUT_S,
    ) -> None:
        self.client = client
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self._last: tuple[float, dict[str, Any]] | None = None
        self._asked = -float("inf")  # monotonic time the last snapshot was asked for

    async def read(self) -> tuple[float, dict[str, Any]]:
        """``(unix time, snapshot)``. Raises APIError 503 when the engine is dead or did not
        answer within ``timeout_s`` (a long step)."""
        arrived = time.monotonic()
        deadline = arrived + self.timeout_s
        try:
            await asyncio.wait_for(self._lock.acquire(), self.timeout_s)
        except TimeoutError:
            raise _busy(self.timeout_s) from None
        try:
            if self._last is not None and self._asked >= arrived:
                return self._last  # asked for while this caller waited
            pause = self._asked + self.min_interval_s - time.monotonic()
            if pause > 0:
                await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            self._asked = time.monotonic()
            future = asyncio.wrap_future(self.client.kv_snapshot())
            try:
                snap = await asyncio.wait_for(future, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise _busy(self.timeout_s) from None
            except EngineDeadError as exc:
                raise APIError(503, str(exc), code="engine_unavailable") from exc
            self._last = (time.time(), snap)
            return self._last
        finally:
            self._lock.release()


def _busy(timeout_s: float) -> APIError:
    return APIError(503, f"the engine took no snapshot within {timeout_s:g} s", code="engine_busy")


def build_state(
    snap: Mapping[str, Any],
    created: float,
    model: str,
    history: CounterHistory,
    *,
    max_cells: int,
    max_requests: int,
    max_pages_per_request: int,
) -> KVState:
    """The response for one engine snapshot (``LLMEngine.kv_snapshot()``) under the limits:
    one group per layer group of the snapshot, each request's table in every group."""
    snap_groups = snap.get("groups") or [
        {
            "pool": snap["pool"],
            "first_layer": 0,
            "num_layers": snap["num_layers"],
            "bytes_per_page": snap["bytes_per_page"],
        }
    ]
    groups = []
    for g, sg in enumerate(snap_groups):
        pool: PoolSnapshot = sg["pool"]
        states = pool.page_states
        counts = {name: states.count(code) for code, name in enumerate(PAGE_STATES)}
        pages_per_cell, num_cells, cells = page_cells(states, max_cells)
        groups.append(
            KVGroup(
                id=g,
                first_layer=sg["first_layer"],
                num_layers=sg["num_layers"],
                kv_dtype=snap["kv_dtype"],
                page_size=pool.page_size,
                bytes_per_page=sg["bytes_per_page"],
                num_pages=pool.num_pages,
                counts=KVPageCounts(**counts),
                num_registered=pool.num_registered,
                pages_per_cell=pages_per_cell,
                num_cells=num_cells,
                cells=cells,
            )
        )
    tables = [{t.seq_id: t for t in sg["pool"].tables} for sg in snap_groups]
    rows = []
    for request_id, seq_id, num_cached in snap["sequences"][:max_requests]:
        table = tables[0].get(seq_id)
        if table is None:
            continue
        rows.append(
            KVRequest(
                request_id=request_id,
                seq_id=seq_id,
                num_tokens=table.num_tokens,
                num_computed_tokens=table.num_written_tokens,
                num_cached_tokens=num_cached,
                tables=[
                    _table(g, by_seq[seq_id], sg["pool"].page_states, max_pages_per_request)
                    for g, (by_seq, sg) in enumerate(zip(tables, snap_groups, strict=True))
                    if seq_id in by_seq
                ],
            )
        )
    return KVState(
        created=created,
        model=model,
        groups=groups,
        requests=rows,
        requests_truncated=snap["num_running"] - len(rows),
        counters=counters_of(snap["stats"]),
        history_interval_s=history.interval_s,
        history=history.points(),
    )


def _table(group: int, table: TableSnapshot, states: bytes, max_pages: int) -> KVTable:
    """One request's table in one group, its first ``max_pages`` entries."""
    pages = list(table.pages[:max_pages])
    letters = "".join("-" if p < 0 else _LETTERS[states[p]] for p in pages)
    return KVTable(
        group=group,
        num_pages=table.num_pages,
        pages=pages,
        states=letters,
        truncated=table.num_pages - len(pages),
    )


def counters_of(stats: Mapping[str, Any]) -> KVCounters:
    """The counters of an engine ``get_stats()``, named and computed as ``/metrics`` does."""
    c = page_counters(stats)
    queries, hits = c["prefix_cache_queries"], c["prefix_cache_hits"]
    store = stats.get("kv_store")
    tier = None
    if store is not None:
        tier = KVTierCounters(
            backend=store["backend"],
            pages_hit=store["pages_hit"],
            pages_missed=store["pages_missed"],
            pages_written=store["pages_written"],
            bytes_read=store["bytes_read"],
            bytes_written=store["bytes_written"],
            restored_tokens=stats.get("tier_restored_tokens", 0),
        )
    return KVCounters(
        num_running=stats["num_running"],
        num_waiting=stats["num_waiting"],
        num_pages=stats["num_pages"],
        num_used_pages=c["used_pages"],
        num_free_pages=stats["num_free_pages"],
        kv_cache_usage=stats["kv_cache_usage"],
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_ratio=hits / queries if queries else None,
        num_preemptions=c["preemptions"],
        evictions=dict(stats["evictions"]),
        tier=tier,
    )


def add_kv_state_route(
    app: FastAPI,
    client: Any,
    model_name: str,
    history: CounterHistory,
    auth: list[Depends],
    responses: dict[int | str, dict[str, Any]],
) -> None:
    """Add ``GET /v1/kv/state`` (behind ``auth``); a 501 when ``client`` cannot snapshot."""
    reader = SnapshotReader(client) if isinstance(client, KVSnapshots) else None

    @app.get("/v1/kv/state", dependencies=auth, response_model=KVState, responses=responses)
    async def kv_state(
        max_cells: Annotated[int, Query(ge=1, le=16384)] = 4096,
        max_requests: Annotated[int, Query(ge=0, le=256)] = 64,
        max_pages_per_request: Annotated[int, Query(ge=0, le=1024)] = 256,
    ) -> KVState:
        """The page pool as cells, the running sequences' page tables and the cache
        counters; ids and counts only (see docs/webui.md)."""
        if reader is None:
            raise APIError(
                501,
                "the engines of this server run elsewhere: ask a replica's /v1/kv/state",
                code="not_implemented",
            )
        client.start()  # as any request does when the ASGI server ran no lifespan
        created, snap = await reader.read()
        return build_state(
            snap,
            created,
            model_name,
            history,
            max_cells=max_cells,
            max_requests=max_requests,
            max_pages_per_request=max_pages_per_request,
        )
