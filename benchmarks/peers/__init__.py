"""Peer drivers: each runs another engine on the same model file, prompt ids and thread count
as our side, in a worker process of its own (:func:`pagedattn.bench.worker.run_worker`).

:data:`TASKS` extends the package's worker registry with the peers' entry points;
:data:`REPO_ROOT` is the folder the worker's child needs on its path to import them.
"""

from __future__ import annotations

from pathlib import Path

from pagedattn.bench.worker import TASKS as OURS

REPO_ROOT = Path(__file__).resolve().parents[2]

TASKS: dict[str, str] = {
    **OURS,
    "generate-hf": "benchmarks.peers.hf_reference:measure_generate",
    "engine-hf": "benchmarks.peers.hf_reference:measure_engine",
    "generate-llamacpp": "benchmarks.peers.llamacpp:measure_generate",
    "engine-llamacpp": "benchmarks.peers.llamacpp:measure_engine",
}
