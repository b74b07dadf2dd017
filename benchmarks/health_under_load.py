"""/health latency and other streams' inter-token gaps while one heavy request runs, against a
control in the same run, on the embedded SmolLM2 served in-process by uvicorn.

    .venv/bin/python benchmarks/health_under_load.py logprobs [--tokens 5000]
    .venv/bin/python benchmarks/health_under_load.py prefill [--tokens 5000] [--streams 2]

``logprobs``: a completion of a ``--tokens`` prompt with ``prompt_logprobs: 20`` + ``echo`` +
``logprobs: 20``, then the same prompt without them; /health is polled every 20 ms while each
runs, and the worst and p99 latency of each are printed (the reply of the first is megabytes of
JSON, built and serialised off the event loop).

``prefill``: ``--streams`` streaming completions decode; after they are under way one request
with a ``--tokens`` prompt arrives; each stream's inter-token gaps while that prompt prefills
are compared with its gaps before it arrived (p50, p99, worst, in ms).
"""

from __future__ import annotations

import argparse
import gc
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


@contextmanager
def serve(**options: object) -> Iterator[str]:
    import uvicorn

    from pagedattn.server.app import build_app

    app = build_app(None, **options)  # type: ignore[arg-type]
    gc.collect()  # as `pagedattn serve`: the start-up heap is kept out of full collections
    gc.freeze()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)


def prompt_of(tokens: int) -> str:
    return "The keeper counted each step of the old lighthouse stairs. " * (tokens // 11)


def poll_health(url: str, stop: threading.Event) -> list[float]:
    lat = []
    with httpx.Client() as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            client.get(f"{url}/health", timeout=60)
            lat.append(time.perf_counter() - t0)
            time.sleep(0.02)
    return lat


def q(values: list[float], pct: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(pct / 100 * len(s)))] if s else float("nan")


def logprobs_case(url: str, tokens: int) -> None:
    for label, extra in (
        ("prompt_logprobs 20 + echo + logprobs 20", {"echo": True, "logprobs": 20,
                                                     "prompt_logprobs": 20}),
        ("control: no logprobs", {}),
    ):  # fmt: skip
        stop = threading.Event()
        lat: list[float] = []
        poller = threading.Thread(
            target=lambda lat=lat, stop=stop: lat.extend(poll_health(url, stop))
        )
        poller.start()
        t0 = time.perf_counter()
        prompt = f"{label}: {prompt_of(tokens)}"  # its own prompt: no prefix-cache hit
        body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, **extra}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
        took = time.perf_counter() - t0
        stop.set()
        poller.join()
        n = r.json()["usage"]["prompt_tokens"]
        print(
            f"{label:42s} prompt {n} tokens, reply {len(r.content) / 1e6:6.1f} MB in {took:5.1f}"
            f" s; /health p99 {q(lat, 99) * 1e3:6.1f} ms, worst {max(lat) * 1e3:6.1f} ms "
            f"({len(lat)} polls)"
        )


def stream_gaps(url: str, out: list[tuple[float, float]], stop: threading.Event) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    last = None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if stop.is_set():
                break  # closing the stream aborts the request
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            if last is not None:
                out.append((now, now - last))
            last = now
            json.loads(line[6:])


def prefill_case(url: str, tokens: int, streams: int) -> None:
    warm = {"prompt": prompt_of(600), "max_tokens": 2, "temperature": 0}
    httpx.post(f"{url}/v1/completions", json=warm, timeout=600)  # kernels, first chunks
    gaps: list[list[tuple[float, float]]] = [[] for _ in range(streams)]
    stop = threading.Event()
    threads = [threading.Thread(target=stream_gaps, args=(url, g, stop)) for g in gaps]
    for t in threads:
        t.start()
    while min(len(g) for g in gaps) < 30:  # every stream is decoding: the "before" control
        time.sleep(0.05)
    arrive = time.perf_counter()
    body = {"prompt": prompt_of(tokens), "max_tokens": 1, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    done = time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    before = [g for s in gaps for (t, g) in s if t < arrive]
    during = [g for s in gaps for (t, g) in s if arrive <= t <= done]
    print(f"long prompt: {r.json()['usage']['prompt_tokens']} tokens, {done - arrive:.1f} s")
    for label, vals in (("before it arrived", before), ("while it prefilled", during)):
        print(
            f"  streams' gaps {label:20s} p50 {statistics.median(vals) * 1e3:7.1f} ms, p99 "
            f"{q(vals, 99) * 1e3:7.1f} ms, worst {max(vals) * 1e3:7.1f} ms ({len(vals)} gaps)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("case", choices=["logprobs", "prefill"])
    ap.add_argument("--tokens", type=int, default=5000)
    ap.add_argument("--streams", type=int, default=2)
    args = ap.parse_args()
    with serve(kv_cache_mib=256) as url:
        if args.case == "logprobs":
            logprobs_case(url, args.tokens)
        else:
            prefill_case(url, args.tokens, args.streams)


if __name__ == "__main__":
    main()
