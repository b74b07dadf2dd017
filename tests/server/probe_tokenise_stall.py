"""Run by hand (not a test): how long /health and a running stream stall while the server
tokenises a big prompt, on the embedded SmolLM2.

    PYTHONPATH=src:. python tests/server/probe_tokenise_stall.py [MEGABYTES]

A stream of 400 greedy tokens runs; after its 10th token a MEGABYTES (default 4) prompt goes
to /v1/completions, then the same text to /tokenize, while /health is polled. Printed per big
request: its wall time and status, the slowest /health answer during it, and the longest gap
between two stream chunks during it (against the stream's median gap).
"""

from __future__ import annotations

import itertools
import statistics
import sys
import threading
import time

import httpx

from pagedattn.server.app import build_app
from tests.server.conftest import serve_app


def main(megabytes: float) -> None:
    app = build_app(None)
    text = ("The quick brown fox jumps over the lazy dog. " * 200_000)[: int(megabytes * 1e6)]
    with serve_app(app) as srv:
        httpx.post(f"{srv.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=600)
        chunks: list[float] = []

        def stream() -> None:
            body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0,
                    "ignore_eos": True, "stream": True}  # fmt: skip
            with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        chunks.append(time.perf_counter())

        streamer = threading.Thread(target=stream)
        streamer.start()
        while len(chunks) < 10:
            time.sleep(0.01)
        for path, body in (
            ("/v1/completions", {"prompt": text, "max_tokens": 1}),
            ("/tokenize", {"prompt": text}),
        ):
            result: dict[str, float] = {}

            def big(path: str, body: dict[str, object], result: dict[str, float]) -> None:
                t0 = time.perf_counter()
                r = httpx.post(srv.url + path, json=body, timeout=600)
                result.update(status=r.status_code, t0=t0, t1=time.perf_counter())

            worker = threading.Thread(target=big, args=(path, body, result))
            worker.start()
            health: list[float] = []
            while worker.is_alive():
                t = time.perf_counter()
                httpx.get(f"{srv.url}/health", timeout=600)
                health.append(time.perf_counter() - t)
            worker.join()
            t0, t1 = result["t0"], result["t1"]
            # every gap between two chunks that overlaps the big request
            gaps = [b - a for a, b in itertools.pairwise(chunks) if b >= t0 and a <= t1]
            all_gaps = [b - a for a, b in itertools.pairwise(chunks)]
            print(
                f"{path} {megabytes} MB: status {int(result['status'])}, {t1 - t0:.2f} s; "
                f"/health max {max(health) * 1000:.0f} ms over {len(health)} polls; stream max "
                f"gap {max(gaps, default=0) * 1000:.0f} ms (median "
                f"{statistics.median(all_gaps) * 1000:.0f} ms)"
            )
        streamer.join()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 4.0)
