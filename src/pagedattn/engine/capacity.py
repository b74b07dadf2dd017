"""How many KV pages a request can hold at once, and whether it can ever run (the scheduler's
admission rules, also used by the server to refuse requests before queueing them)."""

from __future__ import annotations

from pagedattn.config import CacheConfig, SchedulerConfig
from pagedattn.engine.outputs import REJECT_CAPACITY, REJECT_CONTEXT


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def max_pages_per_seq(
    cache: CacheConfig,
    sched: SchedulerConfig,
    max_model_len: int | None,
    num_prompt_tokens: int,
    max_tokens: int,
) -> int:
    """Most pages one sequence can hold at once (its K/V alone, smallest chunks allowed)."""
    kv_tokens = num_prompt_tokens + max_tokens - 1
    if max_model_len is not None:
        kv_tokens = min(kv_tokens, max_model_len - 1)
    ps = cache.page_size
    need = _cdiv(max(kv_tokens, num_prompt_tokens), ps)
    w = cache.sliding_window
    if w is not None:
        chunk = 1 if sched.enable_chunked_prefill else num_prompt_tokens
        sink_pages = _cdiv(cache.num_sink_tokens, ps)
        need = min(need, sink_pages + _cdiv(w + chunk - 2, ps) + 1)
    return need


def request_pages(
    cache: CacheConfig,
    sched: SchedulerConfig,
    max_model_len: int | None,
    num_prompt_tokens: int,
    max_tokens: int,
    num_completions: int = 1,
) -> int:
    """Most pages a request's ``num_completions`` child requests hold at once: the prompt's
    full pages once (shared through the prefix cache; not under a sliding window, which drops
    them), each child's other pages apiece."""
    need = max_pages_per_seq(cache, sched, max_model_len, num_prompt_tokens, max_tokens)
    shared = 0 if cache.sliding_window else min(num_prompt_tokens // cache.page_size, need)
    return need + (num_completions - 1) * (need - shared)


def rejection(
    cache: CacheConfig,
    sched: SchedulerConfig,
    max_model_len: int | None,
    num_pages: int,
    num_prompt_tokens: int,
    max_tokens: int,
    num_completions: int = 1,
) -> tuple[str, str] | None:
    """(finish reason, message) when a request can never run, else None (see
    ``Scheduler.add``)."""
    n, limit = num_prompt_tokens, max_model_len
    if limit is not None and n + min(1, max_tokens) > limit:
        return REJECT_CONTEXT, f"prompt has {n} tokens; max_model_len is {limit}"
    budget = sched.max_num_batched_tokens
    if not sched.enable_chunked_prefill and n > budget:
        return REJECT_CONTEXT, (
            f"prompt has {n} tokens > max_num_batched_tokens={budget} and chunked prefill is off"
        )
    need = request_pages(cache, sched, max_model_len, n, max_tokens, num_completions)
    if need > num_pages:
        return REJECT_CAPACITY, (
            f"needs {need} pages of {cache.page_size} tokens; the pool has {num_pages}"
        )
    return None
