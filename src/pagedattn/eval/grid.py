"""The perplexity lab's grid: every (KV dtype, policy, position mode, budget) run as records.

Budgets come in tokens, or in bytes of KV (every layer's K and V): a byte budget buys as many
whole pages as fit in the dtype's page bytes, so at equal bytes a narrower dtype holds a longer
window. A byte budget's records carry ``budget_bytes`` beside the token ``budget`` it bought.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagedattn.eval.kv_pools import bytes_to_token_budget, check_kv_cache_dtype
from pagedattn.eval.perplexity import PerplexityResult, check_policy_for_model, run_perplexity
from pagedattn.eval.policies import EvictionPolicy, make_policy


@dataclass(frozen=True)
class GridRun:
    """One planned run: the policy built, the token budget, and the byte budget it came from."""

    dtype: str
    policy: EvictionPolicy
    budget: int | None
    budget_bytes: int | None


def plan_grid(
    model: Any,
    policies: list[str],
    modes: list[str],
    budgets: list[int],
    *,
    page_size: int,
    sinks: int,
    seed: int,
    dtypes: tuple[str, ...] | list[str] = ("float32",),
    budget_bytes: tuple[int, ...] | list[int] = (),
) -> list[GridRun]:
    """The runs of the grid, each policy built (a bad name, budget or dtype fails here, before
    any model work): per dtype, ``full`` first (once), then every other policy at every token
    budget and every byte budget.

    The position mode changes only what sink keys see (inside a window RoPE scores depend on
    distances alone), so it is swept for ``sinks``; ``window`` and ``full`` run in absolute
    positions (the same numbers in both), ``h2o`` / ``random`` support absolute only.

    Raises:
        ValueError: an unknown dtype (naming ``--kv-cache-dtype``), policy, mode or budget, or
            one a hybrid model cannot run per layer group (``h2o``, ``shifted``).
    """
    for dtype in dtypes:
        check_kv_cache_dtype(dtype, "--kv-cache-dtype")
    plan: list[GridRun] = []
    for dtype in dtypes:
        sized: list[tuple[int, int | None]] = [(b, None) for b in budgets]
        sized += [(bytes_to_token_budget(b, model, page_size, dtype), b) for b in budget_bytes]
        if "full" in policies:
            plan.append(
                GridRun(dtype, make_policy("full", page_size=page_size, budget=None), None, None)
            )
        for name in policies:
            if name == "full":
                continue
            for mode in modes if name == "sinks" else ["absolute"]:
                for tokens, size in sized:
                    policy = make_policy(
                        name,
                        page_size=page_size,
                        budget=tokens,
                        position_mode=mode,
                        num_sinks=sinks,
                        seed=seed,
                    )
                    check_policy_for_model(model, policy)
                    plan.append(GridRun(dtype, policy, tokens, size))
    return plan


def run_grid(
    model: Any,
    ids: list[int],
    plan: list[GridRun],
    *,
    page_size: int,
    fast: bool,
    progress: Callable[[PerplexityResult], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every planned run on ``ids``; JSON records in plan order."""
    records = []
    for run in plan:
        result = run_perplexity(
            model,
            ids,
            run.policy,
            page_size=page_size,
            budget=run.budget,
            fast=fast,
            kv_cache_dtype=run.dtype,
        )
        if run.budget_bytes is not None:
            result.extra["budget_bytes"] = run.budget_bytes
        records.append(result.record())
        if progress is not None:
            progress(result)
    return records
