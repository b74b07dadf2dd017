"""Where an engine's time goes: the phase timings every step reports, added up over a workload.

:func:`profile_engine` reads each ``LLMEngine.step()``'s
:class:`~pagedattn.engine.step_report.StepReport`. Phases of a step (schedule / run /
postprocess): ``scheduling``, ``batch build`` (ForwardBatch arrays), ``model forward``,
``sampling``, ``detokenization``, ``postprocess`` (outputs and stop checks, detokenization
excluded) and ``python overhead`` (the rest of the step's wall time).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.engine.step_report import StepReport
    from pagedattn.sampling_params import SamplingParams

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


def _add_phases(totals: dict[str, float], report: StepReport) -> None:
    """Add one step's report to the phase totals."""
    t = report.timings
    totals["scheduling"] += t.schedule_s
    totals["batch build"] += t.run.build_s
    totals["model forward"] += t.run.forward_s
    totals["sampling"] += t.run.sample_s
    totals["detokenization"] += t.detokenize_s
    totals["postprocess"] += t.postprocess_s - t.detokenize_s


def profile_engine(
    engine: LLMEngine,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    profiler: Any = None,
) -> ProfileResult:
    """Run ``prompts`` (all queued at once) to completion on ``engine``, adding up the phase
    timings each step reports.

    Args:
        engine: a fresh :class:`pagedattn.engine.llm_engine.LLMEngine`; built on a
            :class:`pagedattn.bench.unfused.UnfusedProfiler` model, its per-op and per-layer
            times are reported too.
        prompts: token-id prompts.
        params: their :class:`pagedattn.sampling_params.SamplingParams`.
        profiler: an optional object with ``enable()`` / ``disable()`` (e.g. ``cProfile.Profile``)
            switched on around the steps only.

    Returns:
        A :class:`ProfileResult`.
    """
    from pagedattn.bench.unfused import UnfusedProfiler

    model = engine.runner.model
    unfused_model = model if isinstance(model, UnfusedProfiler) else None
    totals = dict.fromkeys(PHASES[:-1], 0.0)
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
    if profiler is not None:
        profiler.enable()
    try:
        while engine.has_unfinished_requests():
            outputs = engine.step()
            t1 = time.perf_counter()
            report = outputs.report
            steps.append(report.timings.total_s)
            _add_phases(totals, report)
            peak = max(peak, report.num_pages_used)
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
    phases = dict(totals)
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
