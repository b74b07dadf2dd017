"""Run one benchmark side in a fresh Python process, so each side has its own peak RSS,
thread pools and imports (numba vs torch), and report back as JSON lines.

Protocol (stdout of the child, one JSON object a line): ``{"event": "progress", "phase": str,
"done": int, "total": int}`` any number of times, then ``{"event": "result", "result": {...}}``
with ``peak_rss_mib`` (:func:`peak_rss_mib`: the child's resident-set peak, model loading
included) added, and ``peak_rss_minus_kv_mib`` when the side reported its KV
cache's resident ``kv_cache_mib``, and ``kernels_compiled`` when our kernels ran
(:func:`pagedattn.kernels.numba_cache.compiled_kernels`: not 0 means the peak includes LLVM
compiling them). Arguments travel as a JSON file; nothing is pickled.

:data:`TASKS` registers our side's entry points (``"module:function"``, each called as
``fn(args, progress) -> dict``); a caller outside the package (the peer comparisons in a
source checkout's ``benchmarks/``) passes its own registry and the folders its modules import
from to :func:`run_worker`.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedattn.model.loader import LoadedModel

TASKS = {
    "generate-ours": "pagedattn.bench.generate:measure_ours",
    "engine-ours": "pagedattn.bench.engine:measure_ours",
    "store": "pagedattn.bench.store:measure",
}
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB: ``VmHWM`` of ``/proc/self/status``, the
    high-water mark of this program's own memory. ``getrusage``'s ``ru_maxrss`` (the fallback
    where there is no /proc) survives ``exec``: a child started by a bigger parent would
    report the parent's size."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def resident_mib(array: Any) -> float | None:
    """MiB of ``array``'s memory that is resident now: the present bit of each of its pages in
    Linux's ``/proc/self/pagemap`` (a lazily allocated KV pool counts only the pages touched).
    None where there is no pagemap (not Linux).
    """
    import numpy as np

    page = resource.getpagesize()
    first = int(array.ctypes.data) // page
    last = (int(array.ctypes.data) + int(array.nbytes) - 1) // page
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            entries = np.frombuffer(f.read((last - first + 1) * 8), np.uint64)
    except OSError:
        return None
    present = int(np.count_nonzero(entries >> np.uint64(63)))
    return present * page / float(1 << 20)


def worker_model(loaded: LoadedModel, args: dict[str, Any]) -> Any:
    """The model a benchmark worker runs: ``args["backend"]`` / ``args["device"]`` (default
    numpy) and ``args["activations"]`` (default float32), with torch's intra-op threads set to
    ``args["threads"]``.

    Raises:
        BackendError: the library or device is missing, or cupy.
    """
    from pagedattn.model.build import build_model, resolve_model_backend

    spec = resolve_model_backend(args.get("backend", "numpy"), args.get("device"))
    if spec.name == "torch":
        import torch

        torch.set_num_threads(int(args.get("threads", 1)))
    return build_model(loaded, spec, activations=args.get("activations", "float32"))


def run_worker(
    task: str,
    args: dict[str, Any],
    threads: int,
    on_progress: Callable[[str, int, int], None],
    *,
    tasks: Mapping[str, str] = TASKS,
    pythonpath: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """Run ``task`` (a key of ``tasks``) in a child process with ``threads`` threads for
    numba, BLAS and torch; return its result dict.

    Args:
        tasks: task name -> ``"module:function"`` (default: our side's :data:`TASKS`).
        pythonpath: folders put first on the child's ``PYTHONPATH``, where ``tasks``' modules
            import from.

    Raises:
        ValueError: an unknown task. RuntimeError: the child failed (its last stderr line).
    """
    if task not in tasks:
        raise ValueError(f"task: expected one of {sorted(tasks)}, got {task!r}")
    env = {**os.environ, **dict.fromkeys(THREAD_VARS, str(threads))}
    env.setdefault("HF_HUB_OFFLINE", "1")
    if pythonpath:
        paths = [str(p) for p in pythonpath] + [x for x in [env.get("PYTHONPATH")] if x]
        env["PYTHONPATH"] = os.pathsep.join(paths)
    with tempfile.TemporaryDirectory(prefix="pagedattn-bench-") as tmp:
        args_path = Path(tmp) / "args.json"
        args_path.write_text(json.dumps({**args, "threads": threads}), encoding="utf-8")
        err_path = Path(tmp) / "stderr.txt"
        result: dict[str, Any] | None = None
        with err_path.open("w") as err:
            cmd = [sys.executable, "-m", "pagedattn.bench.worker", tasks[task], str(args_path)]
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env) as p:
                assert p.stdout is not None
                for line in p.stdout:
                    if not line.startswith("{"):
                        continue
                    event = json.loads(line)
                    if event["event"] == "progress":
                        on_progress(event["phase"], event["done"], event["total"])
                    elif event["event"] == "result":
                        result = event["result"]
        if p.returncode != 0 or result is None:
            lines = [x for x in err_path.read_text(errors="replace").splitlines() if x.strip()]
            last = lines[-1] if lines else f"exit code {p.returncode}"
            raise RuntimeError(f"benchmark worker {task!r} failed: {last}")
    return result


def compile_note(result: dict[str, Any]) -> str | None:
    """The line a bench prints when our side of ``result`` compiled kernels in the measured
    process (a cold Numba cache: its figures include the compiler's time and memory), else
    None."""
    compiled = result.get("kernels_compiled", 0)
    if not compiled:
        return None
    return (
        f"ours compiled {compiled} kernel signatures in the measured process (a cold Numba "
        "cache): its peak RSS and times include LLVM's; run the bench again for warm figures."
    )


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _progress(phase: str, done: int, total: int) -> None:
    _emit({"event": "progress", "phase": phase, "done": done, "total": total})


def main(argv: list[str]) -> None:
    """Child entry point: ``python -m pagedattn.bench.worker MODULE:FUNCTION ARGS.json``."""
    entry, args_path = argv
    module, name = entry.split(":")
    fn = getattr(importlib.import_module(module), name)
    args = json.loads(Path(args_path).read_text(encoding="utf-8"))
    result = {**fn(args, _progress), "peak_rss_mib": peak_rss_mib()}
    if "pagedattn.kernels.numba_cache" in sys.modules:  # our side ran kernels
        from pagedattn.kernels.numba_cache import compiled_kernels

        result["kernels_compiled"] = compiled_kernels()
    if result.get("kv_cache_mib") is not None:
        result["peak_rss_minus_kv_mib"] = result["peak_rss_mib"] - result["kv_cache_mib"]
    _emit({"event": "result", "result": result})


if __name__ == "__main__":
    main(sys.argv[1:])
