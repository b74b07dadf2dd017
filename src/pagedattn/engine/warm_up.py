"""Compile or load, before any request, every kernel signature a first request dispatches.

Numba compiles a kernel (or loads it from its on-disk cache) the first time it is called with
a new signature: the dtypes, layouts and read-only flags of its arguments, never their sizes.
What a request calls depends on its shape, so :func:`warm_up` runs a few throwaway requests
through the engine whose steps take every path a request can take:

- a prompt longer than one register group of rows (the decoded-scratch matmuls), with its
  prompt logprobs (the LM head over many rows);
- a three-token prompt added while the first one decodes: a step that mixes a prefill on the
  register matmuls with a decode row (the step-by-step layers and the unfused decode
  attention), then the fused decode of two sequences;
- a prompt that repeats itself, so that the n-gram drafter proposes and a verify step runs
  (when speculative decoding is on).

Every other request (any prompt length, chunked prefill, a prefix-cache hit, logprobs,
penalties, many sequences, ``n`` > 1) combines the same signatures. Each request is seeded and
greedy (the engine's random generator does not advance), and the engine's counters are reset
afterwards (metrics count the user's requests only). Their pages never reach the persistent
tier, and the prefix cache is emptied afterwards: the pool starts as empty as before.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from pagedattn.engine import compile_helper
from pagedattn.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedattn.engine.llm_engine import LLMEngine

LONG_PROMPT = 10  # > one register group of rows (block_dot.DECODE_COLS, 8 at most)
SHORT_PROMPT = 3  # inside one register group
NEW_TOKENS = 4  # a few decode steps: fused, mixed, verify


class WarmUpError(ValueError):
    """A warm-up request failed: the engine cannot run a request (its message says why)."""


def _token_ids(engine: LLMEngine, count: int, period: int) -> list[int]:
    """``count`` ordinary token ids repeating every ``period`` (ids past the first few, which
    are usually special tokens, and inside the vocabulary)."""
    vocab = int(engine.vocab_size)
    first = min(100, max(0, vocab - period))
    return [first + i % period for i in range(count)]


def warm_up(engine: LLMEngine, *, compile_in_parallel: bool = False) -> float:
    """Run the throwaway requests of the module docstring on ``engine`` (idle: it must have no
    unfinished request) and return their wall time in seconds. With ``compile_in_parallel``
    and a cold kernel cache, a second process compiles the fused decode layer meanwhile
    (:mod:`pagedattn.engine.compile_helper`: it loads ``engine.config``'s model, so only for
    an engine built from its config).

    Raises:
        ValueError: the engine has unfinished requests.
        WarmUpError: a warm-up request failed (e.g. the pool or ``max_model_len`` holds less
            than a few tokens); the message is the engine's.
    """
    if engine.has_unfinished_requests():
        raise ValueError("warm_up: expected an idle engine, it has unfinished requests")
    start = time.perf_counter()
    helper = compile_helper.start(engine) if compile_in_parallel else None
    # throwaway pages never reach the persistent tier (nor any layer group's)
    managers = getattr(engine.cache_manager, "group_managers", (engine.cache_manager,))
    tiers = [m.tier for m in managers]
    for m in managers:
        m.tier = None
    try:
        _run_requests(engine)
    finally:
        for m, tier in zip(managers, tiers, strict=True):
            m.tier = tier
        if helper is not None:
            compile_helper.stop(helper)
    engine.reset_prefix_cache()  # nor the prefix cache
    _reset_counters(engine.scheduler.stats)  # the user's requests are the first counted
    return time.perf_counter() - start


def _run_requests(engine: LLMEngine) -> None:
    """The requests of the module docstring, to the end.

    Raises:
        WarmUpError: one failed.
    """
    limit = engine.scheduler.max_model_len or LONG_PROMPT + NEW_TOKENS  # None: unbounded
    new = max(1, min(NEW_TOKENS, limit - 1))
    long_len = max(1, min(LONG_PROMPT, limit - new))
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True, seed=0)
    # the speculative verify sees a periodic prompt; the LM head also runs over every prompt row
    first = engine.add_request(
        _token_ids(engine, long_len, period=3),
        SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True, seed=0, prompt_logprobs=0),
    )
    added_short = False
    failures = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.error:
                failures.append(out.error)
            if out.request_id == first and not added_short:
                # the first request has its first token: the next step mixes a prefill into it
                engine.add_request(_token_ids(engine, min(SHORT_PROMPT, long_len), 1), params)
                added_short = True
    if failures:
        raise WarmUpError(f"warm-up request failed: {failures[0]}")


def _reset_counters(stats: Any) -> None:
    """Every field of the dataclass ``stats`` back to its default, in place (the scheduler's
    parts share the object)."""
    for f in dataclasses.fields(stats):
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        setattr(stats, f.name, default)
