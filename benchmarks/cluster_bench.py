"""Prefix-aware routing against Ray Serve's routers: multi-turn chats on engine replicas that
share one Redis KV tier.

The workload: ``--chats`` chats (32), each a long system prompt shared by all chats, a distinct
opening document and ``--turns`` turns (user question, recorded assistant answer, as a replayed
conversation). Turn ``t`` of every chat is sent in round ``t`` (streamed, greedy,
``ignore_eos``, ``--max-tokens`` each, at most ``--concurrency`` in flight), so turn ``t``'s
history is turn ``t-1``'s prompt. Each router (``prefix``: ours; ``pow2``: Ray's default power of
two choices; ``prefix_tree``: Ray's PrefixCacheAffinityRouter) gets fresh replicas and an empty
Redis database, one router after another in rotating order, ``--repeats`` times; figures pool
every repeat of a router.

Figures per router:

- hit ratios: prompt tokens served from the replica's own page pool (``cached_tokens`` of every
  response minus what the replicas' ``kv_store_restored_tokens`` counters grew by) and from the
  tier (that growth), over every prompt token; the same for the later turns (t >= 1) alone,
  beside the ideal local ratio, where every later turn runs on its history's replica: for each
  such turn, the full pages (at most the prompt's length minus one) of the longest common prefix
  of its token ids and the previous turn's (from the ingress's ``/tokenize``);
- TTFT p50 / p99 (request sent -> first streamed content), output tok/s over the rounds' wall
  time, and the share of later turns on the previous turn's replica (``x-pagedattn-replica``).

Then same-run ratios: our TTFT p50 over pow2's and over prefix_tree's, our later turns' local
hit ratio over the ideal and over prefix_tree's.

Loopback only: a local Ray cluster of ``replicas x --replica-threads`` CPUs and a private
redis-server (or ``--redis URL``, whose database is FLUSHED). Usage::

    python benchmarks/cluster_bench.py                    # tiny random Llama, about 2 minutes
    python benchmarks/cluster_bench.py --model smollm2    # the embedded SmolLM2-135M
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.redis_server import RedisServer, free_port

ROUTERS = ("prefix", "pow2", "prefix_tree")
WORDS = [
    "river",
    "stone",
    "lantern",
    "harbour",
    "meadow",
    "copper",
    "signal",
    "orchard",
    "winter",
    "ledger",
    "canyon",
    "velvet",
    "compass",
    "ember",
    "quarry",
    "falcon",
    "tide",
    "marble",
    "thistle",
    "beacon",
    "glacier",
    "saddle",
    "prism",
    "hollow",
]
# per model: system-prompt words, opening words, question words, answer words, max_tokens
PRESETS = {"tiny": (24, 6, 2, 3, 8), "smollm2": (260, 60, 14, 30, 16)}


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversations(args: argparse.Namespace) -> tuple[str, list[list[tuple[str, str]]]]:
    """The shared system prompt and each chat's (question, recorded answer) turns; the first
    question carries the chat's opening document."""
    sys_w, open_w, q_w, a_w, _ = PRESETS[args.preset]
    rng = random.Random(args.seed)
    system = "You are a careful archivist. Rules: " + words(rng, sys_w) + "."
    chats = []
    for c in range(args.chats):
        turns = [
            (
                (f"Document {c}: {words(rng, open_w)}. " if t == 0 else "")
                + f"Question {t}: {words(rng, q_w)}?",
                f"Answer {t}: {words(rng, a_w)}.",
            )
            for t in range(args.turns)
        ]
        chats.append(turns)
    return system, chats


def messages_of(system: str, turns: list[tuple[str, str]], t: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": system}]
    for q, a in turns[:t]:
        out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return [*out, {"role": "user", "content": turns[t][0]}]


@dataclass
class Sample:
    turn: int
    chat: int
    replica: str
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ideal_cached: int


@dataclass
class RouterRun:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    tier_tokens: dict[str, int] = field(default_factory=dict)  # "all", "later"


def metric_sum(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    )


def replica_count(url: str) -> int:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return len(
        {
            s.labels["replica"]
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "pagedattn:num_pages" and "replica" in s.labels
        }
    )


def prompt_ids(url: str, messages: list[dict[str, str]]) -> list[int]:
    r = httpx.post(f"{url}/tokenize", json={"messages": messages}, timeout=60)
    r.raise_for_status()
    return [int(t) for t in r.json()["tokens"]]


def ideal_cached(ids: list[int], previous: list[int] | None, page_size: int) -> int:
    """Prompt tokens a replica holding ``previous`` (the last turn's prompt) serves from its
    pool: whole pages of the common prefix, at least one prompt token left to compute."""
    if previous is None:
        return 0
    n = 0
    for a, b in zip(ids, previous, strict=False):
        if a != b:
            break
        n += 1
    return min(n, len(ids) - 1) // page_size * page_size


async def one_chat_turn(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[str, float, dict[str, Any]]:
    start = time.perf_counter()
    ttft = float("nan")
    usage: dict[str, Any] = {}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        replica = r.headers.get("x-pagedattn-replica", "?")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                raise RuntimeError(f"stream error: {data['error']}")
            for choice in data.get("choices", []):  # the first token (not the role chunk)
                token = choice["delta"].get("content") or choice.get("finish_reason")
                if token and ttft != ttft:
                    ttft = time.perf_counter() - start
            if data.get("usage"):
                usage = data["usage"]
    return replica, ttft, usage


async def run_round(
    url: str, bodies: list[dict[str, Any]], concurrency: int
) -> list[tuple[str, float, dict[str, Any]]]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:

        async def guarded(body: dict[str, Any]) -> tuple[str, float, dict[str, Any]]:
            async with limit:
                return await one_chat_turn(client, url, body)

        return list(await asyncio.gather(*(guarded(b) for b in bodies)))


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s} s")
        time.sleep(0.25)


def run_router(args: argparse.Namespace, router: str, redis_url: str, port: int) -> RouterRun:
    """Deploy the app with ``router`` on fresh replicas and an empty tier; run every round."""
    import redis
    from ray import serve

    from pagedattn.cluster.app import APP_NAME, build_cluster_app, run_cluster

    redis.Redis.from_url(redis_url).flushdb()
    app = build_cluster_app(
        args.model_path,
        replicas=args.replicas,
        router=router,
        replica_cpus=float(args.replica_threads),
        replica_threads=args.replica_threads,
        kv_store=redis_url,
        page_size=args.page_size,
        kv_cache_mib=args.kv_cache_mib,
        max_num_seqs=args.concurrency,
    )
    url = f"http://127.0.0.1:{port}"
    run_cluster(app, port=port, blocking=False)
    try:
        warm = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        httpx.post(f"{url}/v1/chat/completions", json=warm, timeout=300).raise_for_status()
        wait_for(lambda: replica_count(url) == args.replicas, 120, "every replica's report")
        system, chats = conversations(args)
        _, _, _, _, max_tokens = PRESETS[args.preset]
        run = RouterRun()
        previous: list[list[int] | None] = [None] * len(chats)
        restored = "pagedattn:kv_store_restored_tokens_total"
        tier_before = metric_sum(url, restored)
        for t in range(args.turns):
            msgs = [messages_of(system, turns, t) for turns in chats]
            ids = [prompt_ids(url, m) for m in msgs]
            bodies = [
                {
                    "messages": m,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                for m in msgs
            ]
            start = time.perf_counter()
            results = asyncio.run(run_round(url, bodies, args.concurrency))
            run.wall_s += time.perf_counter() - start
            for c, (replica, ttft, usage) in enumerate(results):
                run.samples.append(
                    Sample(
                        t,
                        c,
                        replica,
                        ttft,
                        int(usage["prompt_tokens"]),
                        int(usage["prompt_tokens_details"]["cached_tokens"]),
                        int(usage["completion_tokens"]),
                        ideal_cached(ids[c], previous[c], args.page_size),
                    )
                )
                previous[c] = ids[c]
            time.sleep(1.5)  # the replicas' counters reach the ingress (0.5 s reports)
            tier_now = metric_sum(url, restored)
            if t == 0:
                run.tier_tokens["first"] = int(tier_now - tier_before)
            run.tier_tokens["all"] = int(tier_now - tier_before)
        return run
    finally:
        serve.delete(APP_NAME)


def figures(runs: list[RouterRun]) -> dict[str, float]:
    samples = [s for r in runs for s in r.samples]
    later = [s for s in samples if s.turn > 0]
    tier_all = sum(r.tier_tokens["all"] for r in runs)
    tier_later = tier_all - sum(r.tier_tokens["first"] for r in runs)
    prompt = sum(s.prompt_tokens for s in samples)
    prompt_later = sum(s.prompt_tokens for s in later) or 1
    cached = sum(s.cached_tokens for s in samples)
    cached_later = sum(s.cached_tokens for s in later)
    by_chat = {(id(r), s.chat, s.turn): s.replica for r in runs for s in r.samples}
    stayed = [
        s.replica == by_chat[(id(r), s.chat, s.turn - 1)]
        for r in runs
        for s in r.samples
        if s.turn > 0
    ]
    ttft = [s.ttft_s for s in samples]
    return {
        "local": (cached - tier_all) / prompt,
        "tier": tier_all / prompt,
        "later_local": (cached_later - tier_later) / prompt_later,
        "later_tier": tier_later / prompt_later,
        "ideal": sum(s.ideal_cached for s in later) / prompt_later,
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "tok_s": sum(s.completion_tokens for s in samples) / sum(r.wall_s for r in runs),
        "stayed": sum(stayed) / max(1, len(stayed)),
        "requests": len(samples),
    }


def report(fig: dict[str, dict[str, float]]) -> None:
    print(
        "| router | requests | local hit | tier hit | later turns: local / tier / ideal local "
        "| same replica as previous turn | TTFT p50 | TTFT p99 | output tok/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, f in fig.items():
        print(
            f"| {name} | {f['requests']:.0f} | {f['local']:.3f} | {f['tier']:.3f} | "
            f"{f['later_local']:.3f} / {f['later_tier']:.3f} / {f['ideal']:.3f} | "
            f"{f['stayed']:.2f} | {f['ttft_p50'] * 1e3:.0f} ms | {f['ttft_p99'] * 1e3:.0f} ms | "
            f"{f['tok_s']:.1f} |"
        )
    ours, pow2, tree = fig["prefix"], fig["pow2"], fig["prefix_tree"]
    ratios = [
        ("TTFT p50, prefix / pow2", ours["ttft_p50"] / pow2["ttft_p50"]),
        ("later turns' local hit ratio, prefix / ideal", ours["later_local"] / ours["ideal"]),
        ("TTFT p50, prefix / prefix_tree", ours["ttft_p50"] / tree["ttft_p50"]),
        ("later turns' local hit ratio, prefix / prefix_tree",
         ours["later_local"] / max(tree["later_local"], 1e-9)),
    ]  # fmt: skip
    print("\n| comparison (same run) | ratio |\n|---|---|")
    for what, ratio in ratios:
        print(f"| {what} | {ratio:.3f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny (random Llama), smollm2, or a path")
    ap.add_argument("--chats", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--replica-threads", type=int, default=1)
    ap.add_argument("--page-size", type=int, default=None, help="default: 4 tiny, else 16")
    ap.add_argument("--kv-cache-mib", type=float, default=256.0, help="per replica")
    ap.add_argument("--repeats", type=int, default=1, help="runs of every router")
    ap.add_argument("--redis", default=None, help="redis://HOST:PORT/DB (FLUSHED before each)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.preset = "tiny" if args.model == "tiny" else "smollm2"
    args.page_size = args.page_size or (4 if args.preset == "tiny" else 16)
    if args.chats < 1 or args.turns < 2 or args.repeats < 1 or args.concurrency < 1:
        ap.error("--chats, --concurrency, --repeats >= 1 and --turns >= 2")
    # read by Ray at import: its local cluster's services listen on 127.0.0.1 only
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    with tempfile.TemporaryDirectory(prefix="cluster-bench-") as tmp:
        if args.model == "tiny":
            from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

            config = tiny_config()
            path = write_tiny_gguf(Path(tmp) / "tiny.gguf", config, random_weights(config, seed=1))
            args.model_path = str(path)
        else:
            args.model_path = None if args.model == "smollm2" else args.model
        own_redis = None if args.redis else RedisServer()
        redis_url = args.redis or own_redis.url  # type: ignore[union-attr]
        ray.init(
            num_cpus=args.replicas * args.replica_threads,
            include_dashboard=False,
            log_to_driver=False,
        )
        runs: dict[str, list[RouterRun]] = {r: [] for r in ROUTERS}
        try:
            port = free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            for rep in range(args.repeats):
                order = ROUTERS[rep % 3 :] + ROUTERS[: rep % 3]
                for router in order:
                    t0 = time.monotonic()
                    runs[router].append(run_router(args, router, redis_url, port))
                    print(f"# repeat {rep}, {router}: {time.monotonic() - t0:.0f} s", flush=True)
        finally:
            serve.shutdown()
            ray.shutdown()
            if own_redis is not None:
                own_redis.stop()
    print(
        f"\n{args.chats} chats x {args.turns} turns, model {args.model}, {args.replicas} "
        f"replicas x {args.replica_threads} thread, concurrency {args.concurrency}, "
        f"page size {args.page_size}, repeats {args.repeats}\n"
    )
    report({r: figures(runs[r]) for r in ROUTERS})


if __name__ == "__main__":
    main()
