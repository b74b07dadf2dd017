"""Multi-turn time to first token on Gemma 3 270M: `pagedattn serve` vs `llama-server`.

Each conversation is a base-model completions prompt that every turn extends with the previous
answer and ``--turn-chars`` more characters of *Pride and Prejudice* (about 700 tokens a turn:
past 2,000 tokens by turn 3); each conversation starts at its own place in the novel, so
conversations share no prefix. Per concurrency, a fresh server of each kind (``-np`` /
``--max-num-seqs`` = the concurrency, the same context per sequence) runs that many
conversations at once, turn after turn, greedy, ``--max-tokens`` tokens each, ``ignore_eos``.
Servers run one at a time (never both: they would share the cores), ours and llama.cpp's
alternating, ``--repeats`` times. Printed per server, concurrency and turn: TTFT p50 (ms), prompt
tokens, and the prompt tokens the server says it reused (ours: ``cached_tokens``; llama.cpp:
``timings.cache_n``), and whether llama.cpp's log says "forcing full prompt re-processing due to
lack of cache data" (its sliding-window layers kept no cache of the earlier turns). Then
llama.cpp's KV buffer sizes at ``--kv-contexts`` (from its startup log, ``-np 1``).

    python benchmarks/multiturn_ttft.py --llama-server /work/peers/llama.cpp/build/bin/llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent / "online"))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the repository root: tests/
from compare import server
from tests.redis_server import free_port

NOVEL = Path(__file__).resolve().parents[1] / "src/pagedattn/data/prideprejudice.txt"
FORCED = "forcing full prompt re-processing due to lack of cache data"
DEFAULT_GGUF = Path.home() / ".cache/pagedattn/models/gemma-3-270m-q4_k_m.gguf"


async def turn(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streaming completion: TTFT, the answer, prompt tokens and reused prompt tokens."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}  # fmt: skip
    start = time.perf_counter()
    out: dict[str, Any] = {"ttft_ms": float("nan"), "text": "", "prompt_tokens": None,
                           "cached_tokens": None}  # fmt: skip
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            for choice in data.get("choices") or []:
                if choice.get("text"):
                    if not out["text"]:
                        out["ttft_ms"] = (time.perf_counter() - start) * 1000
                    out["text"] += choice["text"]
            usage = data.get("usage")
            if usage:
                out["prompt_tokens"] = usage.get("prompt_tokens")
                details = usage.get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    out["cached_tokens"] = details["cached_tokens"]
            timings = data.get("timings")  # llama-server's own figures
            if timings and "cache_n" in timings:
                out["cached_tokens"] = timings["cache_n"]
                out["prompt_tokens"] = timings["cache_n"] + timings.get("prompt_n", 0)
    return out


async def conversations(
    url: str, starts: list[int], turns: int, turn_chars: int, max_tokens: int
) -> list[list[dict[str, Any]]]:
    """``len(starts)`` conversations at once, each ``turns`` turns, from those novel offsets."""
    text = NOVEL.read_text(encoding="utf-8")

    async def one(at: int) -> list[dict[str, Any]]:
        prompt, done = "", []
        for t in range(turns):
            prompt += text[at + t * turn_chars : at + (t + 1) * turn_chars]
            # a connection per turn: llama-server closes a kept-alive one after a stream
            async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client:
                reply = await turn(client, url, prompt, max_tokens)
            prompt += reply["text"] + "\n\n"
            done.append(reply)
        return done

    return list(await asyncio.gather(*(one(at) for at in starts)))


def run_server(
    kind: str, args: argparse.Namespace, conc: int, starts: list[int], log: Path
) -> dict[str, Any]:
    """Start ``kind`` for ``conc`` sequences, warm it up, run the conversations, stop it."""
    port = free_port()
    env = dict(os.environ, NUMBA_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    if kind == "pagedattn":
        cmd = [str(Path(sys.executable).parent / "pagedattn"), "serve", "-m", args.model,
               "--port", str(port), "--log-level", "warning", "--max-num-seqs", str(conc),
               "--max-model-len", str(args.context), *args.serve_args.split()]  # fmt: skip
    else:
        lib = str(Path(args.llama_server).parent)
        env["LD_LIBRARY_PATH"] = f"{lib}:{env.get('LD_LIBRARY_PATH', '')}"
        cmd = [args.llama_server, "-m", str(args.gguf), "--port", str(port), "-t",
               str(args.threads), "-np", str(conc), "-c", str(args.context * conc)]  # fmt: skip
    with server(cmd, port, env, log) as url:
        asyncio.run(conversations(url, [0], 1, 200, 4))  # warm-up: compile, first touch
        began = time.perf_counter()
        convs = asyncio.run(
            conversations(url, starts, args.turns, args.turn_chars, args.max_tokens)
        )
        wall = time.perf_counter() - began
    text = log.read_text(encoding="utf-8", errors="replace")
    return {"command": cmd, "conversations": convs, "wall_s": wall,
            "forced_reprocessing": text.count(FORCED)}  # fmt: skip


def summary(run: dict[str, Any], turns: int) -> list[dict[str, Any]]:
    """Per turn: TTFT p50 / mean over the conversations, prompt and reused tokens (means)."""
    rows = []
    for t in range(turns):
        replies = [c[t] for c in run["conversations"]]
        cached = [r["cached_tokens"] for r in replies if r["cached_tokens"] is not None]
        prompt = [r["prompt_tokens"] for r in replies if r["prompt_tokens"] is not None]
        ttft = [r["ttft_ms"] for r in replies]
        rows.append({"turn": t + 1, "ttft_p50_ms": float(np.median(ttft)),
                     "ttft_mean_ms": float(np.mean(ttft)),
                     "prompt_tokens": float(np.mean(prompt)) if prompt else None,
                     "cached_tokens": float(np.mean(cached)) if cached else None})  # fmt: skip
    return rows


def kv_sizes(args: argparse.Namespace, context: int, log: Path) -> list[str]:
    """llama-server's KV cache lines for ``-c context -np 1`` (from its startup log)."""
    lib = str(Path(args.llama_server).parent)
    env = dict(os.environ, LD_LIBRARY_PATH=f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    port = free_port()
    cmd = [
        args.llama_server,
        "-m",
        str(args.gguf),
        "--port",
        str(port),
        "-t",
        str(args.threads),
        "-np",
        "1",
        "-c",
        str(context),
        "-lv",
        "4",
    ]  # fmt: skip (-lv 4: the KV sizes)
    with server(cmd, port, env, log):
        pass
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return [ln.strip() for ln in lines if re.search(r"llama_kv_cache\w*: (size|creating)", ln)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m", help="our model name or path")
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="the same file for llama.cpp")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-chars", type=int, default=3000, help="new text per turn (~700 tok)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--context", type=int, default=4096, help="context per sequence, both")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--serve-args", default="", help="extra `pagedattn serve` flags, one string")
    ap.add_argument("--servers", default="pagedattn,llama-server", help="which to run")
    ap.add_argument("--kv-contexts", default="8192,2048")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    span = args.turns * args.turn_chars
    results: dict[str, Any] = {"runs": [], "kv": {}}
    offset = 10_000  # past the novel's front matter
    for rep in range(args.repeats):
        for conc in (int(c) for c in args.concurrency.split(",")):
            starts = [offset + i * span for i in range(conc)]
            offset += conc * span  # fresh text each run: no server has seen it
            kinds = args.servers.split(",")
            for kind in kinds if rep % 2 == 0 else kinds[::-1]:
                log = logs / f"multiturn-{kind}-c{conc}-r{rep}.log"
                run = run_server(kind, args, conc, starts, log)
                rows = summary(run, args.turns)
                results["runs"].append({"server": kind, "concurrency": conc, "repeat": rep,
                                        "turns": rows, **run})  # fmt: skip
                forced = f", log: {run['forced_reprocessing']}x {FORCED!r}"
                print(f"{kind} concurrency {conc} repeat {rep} ({run['wall_s']:.0f} s"
                      f"{forced if kind != 'pagedattn' else ''}):")  # fmt: skip
                for r in rows:
                    print(f"  turn {r['turn']}: TTFT p50 {r['ttft_p50_ms']:.0f} ms (mean "
                          f"{r['ttft_mean_ms']:.0f}), prompt {r['prompt_tokens']} tokens, "
                          f"reused {r['cached_tokens']}")  # fmt: skip
    for context in (int(c) for c in args.kv_contexts.split(",") if c):
        lines = kv_sizes(args, context, logs / f"multiturn-kv-{context}.log")
        results["kv"][context] = lines
        print(f"llama-server -c {context} -np 1 KV:")
        for ln in lines:
            print(f"  {ln}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
