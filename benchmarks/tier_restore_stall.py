"""Inter-token latency of running streams while another request restores a 2,000-token prefix
from a Redis KV tier that stops answering for 2 s (SIGSTOP), on the embedded SmolLM2.

    .venv/bin/python benchmarks/tier_restore_stall.py [--prompt-tokens 2000] [--pause-s 2]
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python benchmarks/tier_restore_stall.py

A private redis-server starts on a free loopback port. One engine computes the long prompt and
writes its pages to Redis (the tier), then closes. A fresh engine (an empty pool, as after a
restart) on the same Redis starts ``--streams`` streaming decodes; once they are under way
Redis is SIGSTOPped, the long request is submitted, and Redis gets SIGCONT ``--pause-s`` later.
The streams' inter-token gaps from that submission until the long request's first token are
compared with their gaps before it (p50, p99, worst, in ms), with the number of engine steps
that ran while Redis was stopped, the longest step and the longest scheduling phase in that
window, and the long request's time to first token and cached tokens.

``--deadline-s`` is the engine's ``kv_store_deadline_s`` (the store's timeout follows it): at
the default 0.5 s the restore is given up while Redis is stopped and the prompt is computed
(in chunks beside the streams); past ``--pause-s`` the restore waits for Redis and succeeds.
Run it once on each checkout to compare them (``PYTHONPATH`` picks the ``pagedattn`` it
imports); ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.redis_server import RedisServer

import pagedattn
from pagedattn.bench.corpus import corpus_token_ids, default_corpus_file
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.engine.warm_up import warm_up
from pagedattn.model.build import build_model, resolve_model_backend
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams
from pagedattn.storage.redis_store import RedisStore

STREAM_PROMPTS = [
    "Write a long story about a lighthouse keeper.",
    "Explain how a paged KV cache works, step by step.",
    "List the rivers of Europe and describe each one.",
    "Describe a walk through a forest in autumn.",
    "Tell me about the history of printing.",
    "Write a letter to a friend about a journey.",
]


def _engine(loaded: Any, url: str, args: argparse.Namespace) -> LLMEngine:
    """An engine on the loaded model with a Redis tier whose store waits up to the deadline
    for an answer (``open_store``'s own timeout is 0.5 s, the default deadline)."""
    model = build_model(loaded, resolve_model_backend("numpy", None))
    cache = CacheConfig(kv_cache_mib=args.kv_cache_mib)
    config = EngineConfig(cache=cache, kv_store_deadline_s=args.deadline_s)
    probe = LLMEngine(config, model, loaded.tokenizer, model_fingerprint=loaded.fingerprint)
    pool = probe.page_pool
    shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.row_width)
    timeout_s = max(0.5, args.deadline_s)
    store = RedisStore(url, probe.namespace, shape, pool.dtype, timeout_s=timeout_s)
    return LLMEngine(
        config, model, loaded.tokenizer, model_fingerprint=loaded.fingerprint, kv_store=store
    )


def _gaps_ms(times: list[float]) -> list[float]:
    return [(b - a) * 1e3 for a, b in itertools.pairwise(times)]


def _summary(gaps: list[float]) -> dict[str, float]:
    if not gaps:
        return {"n": 0}
    q = statistics.quantiles(gaps, n=100, method="inclusive") if len(gaps) > 1 else gaps * 99
    return {"n": len(gaps), "p50": statistics.median(gaps), "p99": q[98], "max": max(gaps)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        try:
            return _measure(args, server)
        finally:
            server.stop()


def _measure(args: argparse.Namespace, server: RedisServer) -> dict[str, Any]:
    loaded = load_model(None)  # the embedded SmolLM2
    writer = _engine(loaded, server.url, args)
    tok = writer.tokenizer
    long_prompt = corpus_token_ids(tok, default_corpus_file(), args.prompt_tokens)
    long_prompt = long_prompt[: args.prompt_tokens]
    writer.add_request(long_prompt, SamplingParams(temperature=0.0, max_tokens=1), "fill")
    while writer.has_unfinished_requests():
        writer.step()
    writer.close()  # every page written to Redis
    stored = writer.get_stats()["kv_store"]["pages_written"]

    engine = _engine(loaded, server.url, args)
    warm_up(engine)  # every kernel loaded before the clock starts (as `pagedattn serve`)
    gc.collect()  # and the start-up heap kept out of full collections
    gc.freeze()
    stream = SamplingParams(temperature=0.0, max_tokens=args.stream_tokens, ignore_eos=True)
    times: dict[str, list[float]] = {}
    for i in range(args.streams):
        rid = f"s{i}"
        engine.add_request(tok.encode(STREAM_PROMPTS[i % len(STREAM_PROMPTS)]), stream, rid)
        times[rid] = []

    steps: list[tuple[float, float, float, int]] = []  # (end, total s, schedule s, tokens)

    def step() -> list[Any]:
        outs = engine.step()
        now = time.perf_counter()
        t = outs.report.timings
        steps.append((now, t.total_s, t.schedule_s, outs.report.num_scheduled_tokens))
        for out in outs:
            if out.request_id in times:
                times[out.request_id].extend([now] * len(out.outputs[0].token_ids))
        return list(outs)

    while min(len(t) for t in times.values()) < args.warm_tokens:
        step()
    marks = {rid: len(t) for rid, t in times.items()}
    server.pause()
    submitted = time.perf_counter()
    resume = threading.Timer(args.pause_s, server.resume)
    resume.start()
    engine.add_request(long_prompt, SamplingParams(temperature=0.0, max_tokens=1), "long")
    steps_paused = 0
    final = None
    try:
        while final is None:
            for out in step():
                if out.request_id == "long" and out.finished:
                    final = out
            if time.perf_counter() - submitted < args.pause_s:
                steps_paused += 1
    finally:
        resume.join()
    first_token = time.perf_counter()
    for rid in times:
        engine.abort(rid)
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.get_stats()
    engine.close()
    before = [g for rid, t in times.items() for g in _gaps_ms(t[: marks[rid]])[2:]]
    during = [
        g
        for rid, t in times.items()
        for g in _gaps_ms([x for x in t[marks[rid] - 1 :] if x <= first_token])
    ]
    window = [s for s in steps if submitted < s[0] <= first_token]
    worst = max(window, key=lambda s: s[1])
    return {
        "pagedattn": str(Path(pagedattn.__file__).resolve().parent),
        "prompt_tokens": len(long_prompt),
        "pages_stored": stored,
        "streams": args.streams,
        "pause_s": args.pause_s,
        "deadline_s": args.deadline_s,
        "gaps_before_ms": _summary(before),
        "gaps_during_ms": _summary(during),
        "steps_while_redis_stopped": steps_paused,
        "longest_step_ms": {
            "total": worst[1] * 1e3,
            "schedule": worst[2] * 1e3,
            "tokens": worst[3],
        },
        "longest_schedule_ms": max(s[2] for s in window) * 1e3,
        "long_ttft_s": first_token - submitted,
        "long_cached_tokens": final.num_cached_tokens,
        "tier_restored_tokens": stats["tier_restored_tokens"],
        "kv_store_errors": stats["kv_store"]["errors"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--pause-s", type=float, default=2.0)
    parser.add_argument(
        "--deadline-s", type=float, default=0.5,
        help="kv_store_deadline_s (0.5: the default; past --pause-s the restore succeeds)",
    )  # fmt: skip
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--stream-tokens", type=int, default=2000)
    parser.add_argument("--warm-tokens", type=int, default=16)
    parser.add_argument("--kv-cache-mib", type=int, default=512)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    figures = run(args)
    for key, value in figures.items():
        print(f"{key:28} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
