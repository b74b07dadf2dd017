"""Memory of the cluster's processes: the ingress (HTTP, validation, routing) beside one engine
replica serving the same model, on a local Ray cluster.

It deploys the cluster app with one replica, sends one chat completion through the ingress
(so every route's code has run), and reads each Serve process's resident set (``VmRSS``) and
its peak (``VmHWM``) from ``/proc``, with whether the process has Numba loaded (from
``/proc/PID/maps``). The same-run ratio is the ingress's RSS over the replica's. Linux only.
Usage::

    python benchmarks/ingress_rss.py                  # the embedded SmolLM2-135M
    python benchmarks/ingress_rss.py --model PATH     # a GGUF file or HF folder
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import httpx

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def serve_processes() -> dict[str, int]:
    """PID of each Serve replica process of the app, by deployment name."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        for deployment in ("PagedAttnIngress", "PagedAttnEngine"):
            if f"ServeReplica:pagedattn:{deployment}" in cmdline:
                found[deployment] = int(entry.name)
    return found


def memory_mib(pid: int) -> tuple[float, float, bool]:
    """(RSS MiB, peak RSS MiB, whether the Numba library is mapped) of process ``pid``."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    maps = Path(f"/proc/{pid}/maps").read_text()
    numba = "/numba/" in maps or "llvmlite" in maps
    return (
        int(fields["VmRSS"].split()[0]) / 1024,
        int(fields["VmHWM"].split()[0]) / 1024,
        numba,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2)")
    parser.add_argument("--port", type=int, default=0, help="HTTP port (0 = a free one)")
    args = parser.parse_args()

    import ray
    from ray import serve
    from tests.redis_server import free_port

    from pagedattn.cluster.app import build_cluster_app, run_cluster

    port = args.port or free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        app = build_cluster_app(args.model, replicas=1, webui=False)
        run_cluster(app, port=port, blocking=False)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        httpx.post(url, json=body, timeout=600).raise_for_status()
        pids = serve_processes()
        rows = {name: memory_mib(pid) for name, pid in pids.items()}
        print("| process | RSS MiB | peak RSS MiB | Numba loaded |\n|---|---|---|---|")
        for name, (rss, peak, numba) in sorted(rows.items()):
            print(f"| {name} | {rss:.0f} | {peak:.0f} | {'yes' if numba else 'no'} |")
        if len(rows) == 2:
            ratio = rows["PagedAttnIngress"][0] / rows["PagedAttnEngine"][0]
            print(f"\ningress RSS / replica RSS (same run): {ratio:.2f}x")
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
