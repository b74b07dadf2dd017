"""Worker entry points for tests/bench/test_worker.py, registered by the test the way
benchmarks/peers registers the peers: a KV-like array of a known size, and a failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pagedattn.bench.worker import resident_mib


def hold_kv(args: dict[str, Any], progress: Callable[[str, int, int], None]) -> dict[str, Any]:
    """Touch an ``args["mib"]`` MiB float32 array and report it as the KV cache."""
    progress("allocating", 0, 2)
    kv = np.ones(int(args["mib"]) << 18, np.float32)  # 4-byte items: 2**18 per MiB
    progress("allocated", 1, 2)
    progress("done", 2, 2)
    return {"threads_seen": args["threads"], "kv_cache_mib": resident_mib(kv), "sum": float(kv[-1])}


def no_kv(args: dict[str, Any], progress: Callable[[str, int, int], None]) -> dict[str, Any]:
    return {"answer": 42}


def fail(args: dict[str, Any], progress: Callable[[str, int, int], None]) -> dict[str, Any]:
    raise ValueError("the fake task failed on purpose")
