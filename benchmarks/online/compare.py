"""`pagedattn serve` against llama.cpp's own `llama-server` on the same GGUF, in one session.

Starts each server in turn on a free loopback port (never both at once: they would share the
cores), sends the same burst of streaming chat requests (``load.py``: greedy, ``ignore_eos``,
``--num-requests`` x ``--max-tokens``) at each concurrency, stops it, and prints one row per
concurrency with both servers' output tok/s, TTFT p50 and inter-token p50 and the ratio of
output tok/s, then both TTFT p50 under load (the highest concurrency). At concurrency 1 it also
runs the engine
alone (``engine_itl.py``, in a process of its own, before and after our server) and prints what
the server path adds to the inter-token p50.

Usage (llama-server from ``../shared/scripts/build-llama-cpp.sh``)::

    python benchmarks/online/compare.py --llama-server .peers/llama.cpp/build/bin/llama-server \\
        --concurrency 1,8,32 --num-requests 32 --max-tokens 64 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the repository root: tests/
from load import QUESTIONS, run_setting, summarize
from tests.redis_server import free_port

from pagedattn.model.registry import embedded_model_path


@contextmanager
def server(args: list[str], port: int, env: dict[str, str], log: Path) -> Iterator[str]:
    """Run ``args`` until it answers ``GET /v1/models`` (300 s at most); yield its URL."""
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{args[0]} exited with {proc.returncode}; see {log}")
                try:
                    if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args[0]} did not answer in 300 s; see {log}")
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def measure(
    url: str, concurrency: list[int], n: int, max_tokens: int, questions: list[str]
) -> dict[int, dict[str, float]]:
    """One warm-up request, then a burst of ``n`` requests at each concurrency."""
    asyncio.run(run_setting(url, None, math.inf, 1, 1, 4, 0, questions))
    out = {}
    for c in concurrency:
        results, wall = asyncio.run(
            run_setting(url, None, math.inf, c, n, max_tokens, 0, questions)
        )
        out[c] = summarize(results, wall)
    return out


def workload_questions(workload: str) -> list[str]:
    """The user messages of ``workload``: ``chat`` (short questions) or ``grounded`` (quote,
    summarise, rewrite JSON, edit code: the answer copies its input, where drafts pay)."""
    if workload == "chat":
        return list(QUESTIONS)
    from pagedattn.bench.spec import workloads

    grounded: list[str] = workloads()["grounded"]
    return grounded


def engine_alone(
    model: str, n: int, max_tokens: int, serve_args: list[str], env: dict[str, str]
) -> dict[str, float] | None:
    """``engine_itl.py``'s figures, or None when it cannot take ``serve_args`` (it knows
    ``--activations`` and ``--kv-cache-dtype``) or fails."""
    script = Path(__file__).with_name("engine_itl.py")
    cmd = [sys.executable, str(script), "--model", model, "--num-requests", str(n)]
    cmd += ["--max-tokens", str(max_tokens), *serve_args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(f"engine alone not measured: {done.stderr.strip().splitlines()[-1:]}")
        return None
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2)")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument(
        "--serve-args",
        default="",
        help="extra `pagedattn serve` flags, one string, e.g. "
        "'--activations int8 --kv-cache-dtype float16' (llama.cpp's own arithmetic)",
    )
    ap.add_argument(
        "--workload",
        choices=("chat", "grounded"),
        default="chat",
        help="chat: short questions; grounded: answers that copy their input (speculation's case)",
    )
    ap.add_argument(
        "--peer-spec",
        default="",
        help="llama-server speculative settings to run besides its default, comma-separated "
        "--spec-type values (e.g. ngram-simple,ngram-map-k,ngram-mod); the best is compared",
    )
    ap.add_argument("--peer-draft-max", type=int, default=8, help="--spec-draft-n-max for those")
    args = ap.parse_args()
    model = args.model or str(embedded_model_path())
    questions = workload_questions(args.workload)
    conc = [int(c) for c in args.concurrency.split(",")]
    env = dict(os.environ, NUMBA_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    figures: dict[str, dict[int, dict[str, float]]] = {}
    port = free_port()
    cli = str(Path(sys.executable).parent / "pagedattn")
    ours = [cli, "serve", "-m", model, "--port", str(port)]
    ours += ["--log-level", "warning", "--max-num-seqs", str(max(conc)), *args.serve_args.split()]
    alone: list[dict[str, float] | None] = []
    solo_n = min(args.num_requests, 8)
    solo = 1 in conc and args.workload == "chat"  # the engine-alone script asks chat questions
    if solo:
        alone.append(engine_alone(model, solo_n, args.max_tokens, args.serve_args.split(), env))
    with server(ours, port, env, logs / "compare-pagedattn.log") as url:
        figures["pagedattn"] = measure(url, conc, args.num_requests, args.max_tokens, questions)
    if solo:
        alone.append(engine_alone(model, solo_n, args.max_tokens, args.serve_args.split(), env))
    if alone and all(a is not None for a in alone):
        runs = [a for a in alone if a is not None]
        figures["engine-alone"] = {1: {k: float(np.mean([a[k] for a in runs])) for k in runs[0]}}
    binary = args.llama_server and shutil.which(args.llama_server)
    if binary:
        lib = str(Path(binary).parent)
        peer_env = dict(env, LD_LIBRARY_PATH=f"{lib}:{env.get('LD_LIBRARY_PATH', '')}")
        settings: dict[str, list[str]] = {"llama-server": []}
        for kind in filter(None, args.peer_spec.split(",")):
            settings[f"llama-server {kind}"] = [
                "--spec-type", kind, "--spec-draft-n-max", str(args.peer_draft_max)
            ]  # fmt: skip
        for name, extra in settings.items():
            port = free_port()
            peer = [binary, "-m", model, "--port", str(port), "-t", str(args.threads)]
            peer += ["-np", str(max(conc)), "-c", str(max(conc) * 1024), "--log-disable", *extra]
            with server(peer, port, peer_env, logs / "compare-llama-server.log") as url:
                figures[name] = measure(url, conc, args.num_requests, args.max_tokens, questions)
    report(figures, conc, args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


def report(
    figures: dict[str, dict[int, dict[str, float]]], conc: list[int], args: argparse.Namespace
) -> None:
    ours, peer = figures["pagedattn"], figures.get("llama-server")
    table = Table(
        title=f"online: {args.num_requests} {args.workload} requests x {args.max_tokens} tokens, "
        f"burst, {args.threads} threads"
        f"{', ours with ' + args.serve_args if args.serve_args else ''}"
    )
    for col in ("concurrency", "pagedattn tok/s", "TTFT p50", "ITL p50", "llama-server tok/s",
                "TTFT p50", "ITL p50", "ratio"):  # fmt: skip
        table.add_column(col, justify="right")
    for c in conc:
        o = ours[c]
        row = [str(c), f"{o['output_tok_s']:.1f}", f"{o['ttft_p50_ms']:.0f} ms",
               f"{o['itl_p50_ms']:.1f} ms"]  # fmt: skip
        if peer is None:
            row += ["not measured", "", "", ""]
        else:
            p = peer[c]
            ratio = o["output_tok_s"] / p["output_tok_s"]
            row += [f"{p['output_tok_s']:.1f}", f"{p['ttft_p50_ms']:.0f} ms",
                    f"{p['itl_p50_ms']:.1f} ms", f"{ratio:.2f}x"]  # fmt: skip
        table.add_row(*row)
    console = Console(width=160)
    console.print(table)
    solo = figures.get("engine-alone")
    if solo is not None:
        server_itl, engine_itl = ours[1]["itl_p50_ms"], solo[1]["itl_p50_ms"]
        extra = server_itl - engine_itl
        console.print(
            f"inter-token p50 at concurrency 1: server {server_itl:.2f} ms vs the engine alone "
            f"{engine_itl:.2f} ms (mean of a run before and after the server): the server path "
            f"adds {extra:+.2f} ms ({extra / engine_itl:+.1%}; means {ours[1]['itl_mean_ms']:.2f} "
            f"vs {solo[1]['itl_mean_ms']:.2f} ms)"
        )
    spec = {k: v for k, v in figures.items() if k.startswith("llama-server ")}
    for c in conc if spec else []:
        name, best = max(spec.items(), key=lambda kv: kv[1][c]["output_tok_s"])
        ratio = ours[c]["output_tok_s"] / best[c]["output_tok_s"]
        console.print(
            f"concurrency {c}: against llama-server's best speculative setting of "
            f"{sorted(spec)} ({name}, draft max {args.peer_draft_max}: "
            f"{best[c]['output_tok_s']:.1f} tok/s): {ratio:.2f}x"
        )
    if peer is not None:
        top = max(conc)
        ttft = ours[top]["ttft_p50_ms"] / peer[top]["ttft_p50_ms"]
        console.print(
            f"TTFT p50 at concurrency {top}: {ours[top]['ttft_p50_ms']:.0f} ms vs "
            f"{peer[top]['ttft_p50_ms']:.0f} ms: {ttft:.2f}x"
        )


if __name__ == "__main__":
    main()
