"""The schema of ``GET /v1/kv/state``: the paged KV cache as ids and counts (never token ids
or text), bounded in size whatever the pool holds (see docs/webui.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

#: A page's state, by the letter the cell runs and page-table rows use.
STATE_LETTERS = {"free": "f", "cached": "c", "used": "u", "shared": "s"}


class KVPageCounts(BaseModel):
    """Pages of a group by state (exact, whatever the aggregation of the cells)."""

    free: int = Field(description="No reference and no cached prefix.")
    cached: int = Field(description="No reference, holds a cached prefix (in the LRU).")
    used: int = Field(description="Referenced by one page-table entry.")
    shared: int = Field(description="Referenced by several page-table entries.")


class KVGroup(BaseModel):
    """One pool of pages (today one: every layer; a hybrid cache has one per layer group)."""

    id: int
    first_layer: int
    num_layers: int
    kv_dtype: str = Field(description="Storage dtype of the pages: float32, float16, int8...")
    page_size: int = Field(description="Tokens per page.")
    bytes_per_page: int = Field(description="KV bytes of one page, all layers of the group.")
    num_pages: int
    counts: KVPageCounts
    num_registered: int = Field(description="Pages in the prefix index, referenced or not.")
    pages_per_cell: int = Field(description="Pages each cell stands for (1 = a cell per page).")
    num_cells: int
    cells: list[tuple[Literal["f", "c", "u", "s"], int]] = Field(
        description=(
            "Run-length encoded cell states, in page-id order: [state letter, run length]. "
            "A cell of several pages takes the most common state among them (a tie goes to "
            "the busier state: shared > used > cached > free)."
        )
    )


class KVTable(BaseModel):
    """A sequence's page table in one group."""

    group: int
    num_pages: int = Field(description="Entries in the table (the listed ones may be fewer).")
    pages: list[int] = Field(description="Page ids in position order; -1 = a dropped page.")
    states: str = Field(description="One letter per listed page: u used, s shared, - dropped.")
    truncated: int = Field(description="Entries not listed (num_pages - len(pages)).")


class KVRequest(BaseModel):
    """A running sequence (one per completion of a request with n > 1)."""

    request_id: str
    seq_id: int
    num_tokens: int = Field(description="KV tokens reserved.")
    num_computed_tokens: int = Field(description="Of those, written (or prefix-cached).")
    num_cached_tokens: int = Field(description="Prompt tokens its admission hit in the cache.")
    tables: list[KVTable]


class KVTierCounters(BaseModel):
    """The persistent KV tier below the pool (monotonic counters)."""

    backend: str
    pages_hit: int
    pages_missed: int
    pages_written: int
    bytes_read: int
    bytes_written: int
    restored_tokens: int


class KVCounters(BaseModel):
    """The engine's counters at the snapshot, the same values ``/metrics`` exports."""

    num_running: int = Field(description="pagedattn:num_requests_running")
    num_waiting: int = Field(description="pagedattn:num_requests_waiting")
    num_pages: int = Field(description="pagedattn:num_pages")
    num_used_pages: int = Field(description="pagedattn:num_used_pages")
    num_free_pages: int = Field(description="pagedattn:num_free_pages (cached ones too)")
    kv_cache_usage: float = Field(description="pagedattn:kv_cache_usage_perc (0..1)")
    prefix_cache_queries: int = Field(description="pagedattn:prefix_cache_queries_total")
    prefix_cache_hits: int = Field(description="pagedattn:prefix_cache_hits_total")
    prefix_cache_hit_ratio: float | None = Field(description="hits / queries; None before any")
    num_preemptions: int = Field(description="pagedattn:num_preemptions_total")
    evictions: dict[str, int] = Field(description="pagedattn:page_evictions_total by reason")
    tier: KVTierCounters | None = Field(description="The kv_store_* families; None without one")


class KVRatePoint(BaseModel):
    """Rates over one sampling interval ending at ``time``."""

    time: float = Field(description="Unix time (s) at the end of the interval.")
    interval_s: float
    used_pages: int = Field(description="Pages held by sequences at ``time``.")
    prefix_cache_hit_ratio: float | None = Field(description="Over the interval; None: no query")
    evictions_per_s: float
    preemptions_per_s: float
    tier_pages_read_per_s: float | None
    tier_pages_written_per_s: float | None
    tier_bytes_read_per_s: float | None
    tier_bytes_written_per_s: float | None


class KVState(BaseModel):
    """``GET /v1/kv/state``."""

    object: Literal["kv.state"] = "kv.state"
    created: float = Field(description="Unix time (s) of the snapshot.")
    model: str
    groups: list[KVGroup]
    requests: list[KVRequest]
    requests_truncated: int = Field(description="Running sequences not listed.")
    counters: KVCounters
    history_interval_s: float
    history: list[KVRatePoint] = Field(description="Oldest first, the last few minutes.")
