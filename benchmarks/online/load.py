"""Online load generator for `pagedattn serve` (or any OpenAI-compatible server).

For each (request rate, max concurrency) pair it sends ``--num-requests`` streaming chat or
completion requests with Poisson arrivals (exponential gaps, like vLLM's
``benchmarks/benchmark_serving.py``; rate ``inf`` = all at once), caps the requests in flight at
the concurrency, and reports per setting: request and output-token throughput, TTFT
(request sent -> first content chunk) and inter-token latency (gaps between consecutive content
chunks: one per token, except when the detokenizer holds text back) at p50 / p99.

Usage::

    pagedattn serve --port 8000 &
    python benchmarks/online/load.py --url http://127.0.0.1:8000 --rates 1,4,inf \
        --concurrency 4,16 --num-requests 32 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Explain what a hash table is in one sentence.",
    "Write a haiku about the sea.",
    "What is 17 times 23?",
    "Give one tip for learning a new language.",
    "Why is the sky blue?",
    "What does a CPU cache do?",
]


@dataclass
class Result:
    ok: bool
    ttft_s: float = math.nan
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    latency_s: float = 0.0
    error: str = ""


async def one_request(
    client: httpx.AsyncClient, url: str, model: str | None, question: str, max_tokens: int
) -> Result:
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    if model:
        body["model"] = model
    start = time.perf_counter()
    result = Result(ok=False)
    chunk_times: list[float] = []
    content_chunks = 0
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("usage"):
                    result.output_tokens = data["usage"]["completion_tokens"]
                for choice in data.get("choices", []):
                    if choice["delta"].get("content"):
                        chunk_times.append(time.perf_counter())
                        content_chunks += 1
    except httpx.HTTPError as exc:
        result.error = repr(exc)
        return result
    result.latency_s = time.perf_counter() - start
    if not result.output_tokens:  # a server that sends no usage: one token per content chunk
        result.output_tokens = content_chunks
    if chunk_times:
        result.ttft_s = chunk_times[0] - start
        result.itl_s = np.diff(chunk_times).tolist()
    result.ok = True
    return result


async def run_setting(
    url: str,
    model: str | None,
    rate: float,
    concurrency: int,
    n: int,
    max_tokens: int,
    seed: int,
    questions: Sequence[str] = QUESTIONS,
) -> tuple[list[Result], float]:
    """Send ``n`` requests (the ``questions`` in turn) at ``rate`` with ``concurrency`` in flight;
    return the results and the wall time."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(concurrency)
    timeout = httpx.Timeout(600.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=None)) as c:

        async def guarded(q: str) -> Result:
            async with limit:
                return await one_request(c, url, model, q, max_tokens)

        tasks = []
        start = time.perf_counter()
        for i in range(n):
            tasks.append(asyncio.create_task(guarded(questions[i % len(questions)])))
            if math.isfinite(rate):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else math.nan


def summarize(results: list[Result], wall_s: float) -> dict[str, float]:
    """Figures of one setting: ok, total, req/s, output tok/s, TTFT and ITL p50 / p99, ITL mean
    (ms)."""
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if math.isfinite(r.ttft_s)]
    itl = [g for r in ok for g in r.itl_s]
    return {
        "ok": len(ok),
        "total": len(results),
        "req_s": len(ok) / wall_s,
        "output_tok_s": sum(r.output_tokens for r in ok) / wall_s,
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p99_ms": pct(ttft, 99),
        "itl_p50_ms": pct(itl, 50),
        "itl_p99_ms": pct(itl, 99),
        "itl_mean_ms": float(np.mean(itl)) * 1000 if itl else math.nan,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model name (default: the server's)")
    ap.add_argument("--rates", default="1,inf", help="requests/s, comma-separated; inf = burst")
    ap.add_argument("--concurrency", default="4,16", help="max requests in flight, comma list")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    console = Console(width=160)
    table = Table(title=f"online load: {args.num_requests} requests x {args.max_tokens} tokens")
    for col in (
        "rate (req/s)",
        "concurrency",
        "ok/total",
        "req/s",
        "output tok/s",
        "TTFT p50 (ms)",
        "TTFT p99 (ms)",
        "ITL p50 (ms)",
        "ITL p99 (ms)",
    ):
        table.add_column(col, justify="right")
    for rate in [float(r) for r in args.rates.split(",")]:
        for conc in [int(c) for c in args.concurrency.split(",")]:
            results, wall = asyncio.run(
                run_setting(
                    args.url, args.model, rate, conc, args.num_requests, args.max_tokens, args.seed
                )
            )
            for r in results:
                if not r.ok:
                    console.print(f"[red]failed:[/red] {r.error}")
            f = summarize(results, wall)
            table.add_row(
                "inf" if math.isinf(rate) else f"{rate:g}",
                str(conc),
                f"{f['ok']:.0f}/{f['total']:.0f}",
                f"{f['req_s']:.2f}",
                f"{f['output_tok_s']:.1f}",
                f"{f['ttft_p50_ms']:.0f}",
                f"{f['ttft_p99_ms']:.0f}",
                f"{f['itl_p50_ms']:.1f}",
                f"{f['itl_p99_ms']:.1f}",
            )
    console.print(table)


if __name__ == "__main__":
    main()
