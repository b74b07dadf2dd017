"""`--backend` on `pagedattn bench generate` / `bench engine`: the same measurement of our
engine on several array backends in one run, printed side by side with ratios to the first.

Each backend runs in its own worker process (:mod:`pagedattn.bench.worker`), one after the
other, on the same prompts and thread count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pagedattn.backends import BackendError, BackendSpec, validate_backend

if TYPE_CHECKING:
    from rich.progress import Progress
    from rich.table import Table

BackendsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--backend",
        metavar="NAME[/DEVICE]",
        help="Array backend(s) of our engine: repeat or comma-separate (numpy,torch,torch/cuda);"
        " the first one is 'ours' in the main table, every one is compared in a second table. "
        "Default: numpy.",
    ),
]


def parse_backends(values: Sequence[str] | None) -> list[BackendSpec]:
    """``["numpy,torch", "torch/cuda"]`` -> the validated pairs, in order, without repeats.

    Raises:
        BackendError: an unknown name or device, or an invalid pair.
    """
    specs: list[BackendSpec] = []
    for item in ",".join(values or ["numpy"]).split(","):
        name, _, device = item.strip().partition("/")
        if not name:
            raise BackendError(f"--backend: expected NAME[/DEVICE], got {item!r}")
        spec = validate_backend(name, device or None)
        if spec not in specs:
            specs.append(spec)
    return specs


def backend_args(spec: BackendSpec) -> dict[str, str]:
    """The worker arguments that select ``spec``."""
    return {"backend": spec.name, "device": spec.device}


def measure_backends(
    task: str,
    args: dict[str, Any],
    specs: Sequence[BackendSpec],
    threads: int,
    progress: Progress,
    first: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """Run ``task`` (a :data:`pagedattn.bench.worker.TASKS` key) on every backend after the
    first, whose result ``first`` the caller already has.

    Returns:
        ``str(spec)`` -> the worker's result dict, in ``specs`` order.

    Raises:
        RuntimeError: a worker failed (its last stderr line).
    """
    from pagedattn.bench.worker import run_worker

    results = {str(specs[0]): first}
    for spec in specs[1:]:
        bar = progress.add_task(f"{spec}: loading", total=None)

        def update(phase: str, done: int, total: int, bar: Any = bar, spec: Any = spec) -> None:
            progress.update(bar, description=f"{spec} {phase}", completed=done, total=total)

        results[str(spec)] = run_worker(task, {**args, **backend_args(spec)}, threads, update)
    return results


def backend_table(
    title: str, results: dict[str, dict[str, Any]], rows: list[tuple[str, str]]
) -> Table:
    """A table with one column per backend and, for each later backend, its ratio to the first.

    Args:
        results: ``str(spec)`` -> result dict (as :func:`measure_backends` returns).
        rows: (label, dotted key into a result dict, e.g. ``"main.generated_tok_s"``).
    """
    from rich.table import Table

    names = list(results)
    table = Table(title=title)
    table.add_column("metric")
    for name in names:
        table.add_column(name, justify="right")
    for name in names[1:]:
        table.add_column(f"{name} / {names[0]}", justify="right")
    for label, key in rows:
        values = [_lookup(results[n], key) for n in names]
        ratios = [f"{v / values[0]:.2f}x" if values[0] else "-" for v in values[1:]]
        table.add_row(label, *(f"{v:.1f}" for v in values), *ratios)
    return table


def _lookup(result: dict[str, Any], key: str) -> float:
    value: Any = result
    for part in key.split("."):
        value = value[part]
    return float(value)
