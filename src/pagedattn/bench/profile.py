"""Where an engine's time goes: step-phase timers wrapped around a live engine from outside.

Nothing here is on the default path: :func:`profile_engine` wraps the engine's scheduler,
runner, model, sampler and detokenizer with ``perf_counter`` pairs for the duration of one
workload and restores them afterwards. Phases of a step (``LLMEngine.step`` = schedule /
run / postprocess): ``scheduling``, ``batch build`` (ForwardBatch arrays), ``model forward``,
``sampling``, ``detokenization``, ``postprocess`` (outputs and stop checks, detokenization
excluded) and ``python overhead`` (the rest of the step's wall time).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PHASES = (
    "scheduling",
    "batch build",
    "model forward",
    "sampling",
    "detokenization",
    "postprocess",
    "python overhead",
)


@dataclass
class ProfileResult:
    """One workload's measurements (seconds unless named otherwise)."""

    phases: dict[str, float]
    step_seconds: list[float]
    token_latencies: list[float]  # gap before each generated token after a request's first
    ttfts: list[float]  # arrival -> first token, per request
    generated_tokens: int
    wall_seconds: float
    prefix_hit_ratio: float  # prefix-cache hit tokens / looked-up prompt tokens (0 if none)
    peak_pages: int  # most pages referenced after any step
    num_pages: int
    kv_bytes: int
    by_layer: dict[int, float] = field(default_factory=dict)  # unfused mode only
    by_op: dict[str, float] = field(default_factory=dict)  # unfused mode only

    @property
    def throughput(self) -> float:
        """Generated tokens per second of wall time."""
        return self.generated_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def latency_percentile(self, q: float) -> float:
        """Per-token latency percentile (s) over generated tokens after the first; 0 if none."""
        return float(np.percentile(self.token_latencies, q)) if self.token_latencies else 0.0


class _Timer:
    def __init__(self) -> None:
        self.totals: defaultdict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[name] += time.perf_counter() - began

        return timed


class _TimedModel:
    def __init__(self, model: Any, timer: _Timer) -> None:
        self.model = model
        self.forward = timer.wrap("model forward", model.forward)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@contextmanager
def _instrumented(engine: Any, timer: _Timer, unfused: Any) -> Iterator[None]:
    """Wrap the engine's phases with timers; restore everything on exit."""
    from pagedattn.engine import model_runner
    from pagedattn.model.detokenizer import IncrementalDetokenizer

    sched, runner = engine.scheduler, engine.runner
    sample = getattr(model_runner, "sample_each")  # noqa: B009 - the runner's module global
    saved = (sched.schedule, sched.postprocess, runner.build, runner.model, sample)
    saved_detok = (IncrementalDetokenizer.add_token, IncrementalDetokenizer.flush)
    sched.schedule = timer.wrap("scheduling", sched.schedule)
    sched.postprocess = timer.wrap("postprocess", sched.postprocess)
    runner.build = timer.wrap("batch build", runner.build)
    runner.model = _TimedModel(unfused if unfused is not None else runner.model, timer)
    setattr(model_runner, "sample_each", timer.wrap("sampling", sample))  # noqa: B010
    IncrementalDetokenizer.add_token = timer.wrap(  # type: ignore[method-assign]
        "detokenization", saved_detok[0]
    )
    IncrementalDetokenizer.flush = timer.wrap(  # type: ignore[method-assign]
        "detokenization", saved_detok[1]
    )
    try:
        yield
    finally:
        del sched.schedule, sched.postprocess, runner.build
        runner.model = saved[3]
        setattr(model_runner, "sample_each", saved[4])  # noqa: B010
        IncrementalDetokenizer.add_token, IncrementalDetokenizer.flush = saved_detok  # type: ignore[method-assign]


def profile_engine(
    engine: Any,
    prompts: Sequence[Sequence[int]],
    params: Any,
    *,
    unfused: bool = False,
    profiler: Any = None,
) -> ProfileResult:
    """Run ``prompts`` (all queued at once) to completion on ``engine`` with timers on.

    Args:
        engine: a fresh :class:`pagedattn.engine.llm_engine.LLMEngine`.
        prompts: token-id prompts.
        params: their :class:`pagedattn.sampling_params.SamplingParams`.
        unfused: time each op of each layer (:class:`pagedattn.bench.unfused.UnfusedProfiler`;
            same logits, small timer overhead).
        profiler: an optional object with ``enable()`` / ``disable()`` (e.g. ``cProfile.Profile``)
            switched on around the steps only.

    Returns:
        A :class:`ProfileResult`.
    """
    from pagedattn.bench.unfused import UnfusedProfiler

    timer = _Timer()
    unfused_model = UnfusedProfiler(engine.runner.model) if unfused else None
    arrival: dict[str, float] = {}
    last: dict[str, float] = {}
    result_lat: list[float] = []
    ttfts: list[float] = []
    steps: list[float] = []
    generated, peak = 0, 0
    began = time.perf_counter()
    for i, p in enumerate(prompts):
        rid = f"profile-{i}"
        engine.add_request(list(p), params, rid)
        arrival[rid] = time.perf_counter()
    with _instrumented(engine, timer, unfused_model):
        if profiler is not None:
            profiler.enable()
        try:
            while engine.has_unfinished_requests():
                t0 = time.perf_counter()
                outputs = engine.step()
                t1 = time.perf_counter()
                steps.append(t1 - t0)
                stats = engine.get_stats()
                peak = max(peak, stats["num_pages"] - stats["num_free_pages"])
                for out in outputs:
                    n = sum(len(c.token_ids) for c in out.outputs)
                    if n == 0:
                        continue
                    generated += n
                    rid = out.request_id
                    if rid not in last:
                        ttfts.append(t1 - arrival[rid])
                        n -= 1
                    elif n:
                        result_lat.extend([(t1 - last[rid]) / n] * n)
                    last[rid] = t1
        finally:
            if profiler is not None:
                profiler.disable()
    wall = time.perf_counter() - began
    phases = {name: timer.totals.get(name, 0.0) for name in PHASES[:-1]}
    phases["postprocess"] -= phases["detokenization"]
    phases["python overhead"] = max(sum(steps) - sum(phases.values()), 0.0)
    stats = engine.get_stats()
    queries = stats["prefix_cache_queries"]
    return ProfileResult(
        phases=phases,
        step_seconds=steps,
        token_latencies=result_lat,
        ttfts=ttfts,
        generated_tokens=generated,
        wall_seconds=wall,
        prefix_hit_ratio=stats["prefix_cache_hits"] / queries if queries else 0.0,
        peak_pages=peak,
        num_pages=stats["num_pages"],
        kv_bytes=int(engine.page_pool.nbytes),
        by_layer=dict(unfused_model.by_layer) if unfused_model is not None else {},
        by_op=dict(unfused_model.by_op) if unfused_model is not None else {},
    )


def parse_sweep(items: Sequence[str], allowed: Sequence[str]) -> list[dict[str, str]]:
    """``["page_size=8,16", "kv_cache_mib=64,128"]`` -> every combination, as dicts.

    Raises:
        ValueError: an item without ``=``, an empty value list, or a key not in ``allowed``.
    """
    grid: list[dict[str, str]] = [{}]
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not vals:
            raise ValueError(f"--sweep: expected key=v1,v2,..., got {item!r}")
        if key not in allowed:
            raise ValueError(f"--sweep: key {key!r} not one of {', '.join(allowed)}")
        grid = [{**g, key: v} for g in grid for v in vals]
    return grid


def sweep_rows(results: Sequence[tuple[dict[str, str], ProfileResult]]) -> list[dict[str, Any]]:
    """One table row per configuration; ``best`` marks the highest throughput."""
    rows = [
        {
            **config,
            "throughput_tok_s": r.throughput,
            "ttft_s": float(np.mean(r.ttfts)) if r.ttfts else 0.0,
            "prefix_hit_ratio": r.prefix_hit_ratio,
            "peak_pages": r.peak_pages,
            "num_pages": r.num_pages,
            "kv_mib": r.kv_bytes / 2**20,
            "best": False,
        }
        for config, r in results
    ]
    if rows:
        best = int(np.argmax([r.throughput for _, r in results]))
        rows[best]["best"] = True
    return rows
