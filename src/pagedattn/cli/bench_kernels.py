"""`pagedattn bench kernels`: decode attention, paged kernel vs copy bandwidth and torch SDPA,
and with ``--backend`` the array-namespace kernel on other array libraries in the same run."""

from __future__ import annotations

import itertools
from typing import Annotated, Any

import typer

from pagedattn.cli.app import bench_app
from pagedattn.cli.errors import cli_errors


@bench_app.command("kernels")
def bench_kernels(
    repeats: Annotated[int, typer.Option(min=1, help="Timed calls per measurement (median).")] = 20,
    batch: Annotated[
        list[int] | None,
        typer.Option(min=1, help="Batch size; repeat for several (default: 1 and 32)."),
    ] = None,
    context: Annotated[
        list[int] | None,
        typer.Option(
            min=1, help="KV tokens per sequence; repeat for several (default: 512, 2048, 8192)."
        ),
    ] = None,
    backend: Annotated[
        list[str] | None,
        typer.Option(
            help="Also time the array-namespace kernel on numpy|torch|cupy (repeatable), "
            "beside the Numba kernel, with its ratio."
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help="cpu|cuda for a torch / cupy --backend (numpy is always cpu)."),
    ] = None,
    kv_cache_dtype: Annotated[
        list[str] | None,
        typer.Option(
            "--kv-cache-dtype",
            metavar="float32|float16|int8",
            help="Storage of the paged pool (repeatable: one table section each, then the "
            "dtypes timed interleaved, each as a ratio to float16); torch SDPA always "
            "reads float32.",
        ),
    ] = None,
) -> None:
    """Decode attention (9 q heads, 3 kv heads, head_dim 64, page_size 16, shuffled pages)."""
    import numba
    from rich.console import Console
    from rich.table import Table

    from pagedattn.backends import resolve_backend
    from pagedattn.bench.kernel_comparisons import kernel_comparisons
    from pagedattn.bench.kernels import TORCH_HINT, bench_decode, check_decode_options

    with cli_errors():  # --device is for torch / cupy; the numpy backend is always on the cpu
        specs = [
            resolve_backend(name, None if name == "numpy" else device) for name in backend or []
        ]
        dtypes = kv_cache_dtype or ["float32"]
        for name in dtypes:
            check_decode_options(name, specs)
    console = Console()
    batches = batch or [1, 32]
    contexts = context or [512, 2048, 8192]
    try:
        import torch  # noqa: F401

        has_torch = True
    except ImportError:
        has_torch = False
        console.print(TORCH_HINT)

    comparisons = Table(title="same-run comparisons of the paged kernel")
    for name in ("row", "comparison", "measured"):
        comparisons.add_column(name, justify="right" if name == "measured" else "left")
    for dtype in dtypes:
        table = Table()
        columns = ("batch", "context", "paged ms", "KV GB/s", "read GB/s", "% read")
        for name in (*columns, "copy GB/s (r+w)"):
            table.add_column(name, justify="right")
        for spec in specs:
            table.add_column(f"xp {spec} ms", justify="right")
            table.add_column("x numba", justify="right")
        if has_torch:
            table.add_column("torch SDPA fp32 ms", justify="right")
            table.add_column("speedup", justify="right")
        for b, c in itertools.product(batches, contexts):
            r = bench_decode(b, c, repeats, backends=specs, kv_cache_dtype=dtype)
            row = [
                str(b),
                str(c),
                f"{r.paged_ms:.3f}",
                f"{r.kv_gbps:.1f}",
                f"{r.read_gbps:.1f}",
                f"{r.pct_read:.0f}%",
                f"{r.copy_gbps:.1f}",
            ]
            for _, ms in r.xp_ms:
                row += [f"{ms:.3f}", f"{ms / r.paged_ms:.2f}x"]
            if has_torch and r.torch_ms is not None and r.speedup is not None:
                row += [f"{r.torch_ms:.3f}", f"{r.speedup:.2f}x"]
            table.add_row(*row)
            for label, value in kernel_comparisons(r.pct_read, r.speedup):
                comparisons.add_row(f"{dtype} KV, batch {b}, context {c}", label, value)
        layer = numba.threading_layer()  # type: ignore[attr-defined]  # known after a call
        table.title = (
            f"decode attention, {dtype} KV pool, {numba.get_num_threads()} threads "
            f"(numba threading layer {layer}), median of {repeats} interleaved rounds"
        )
        console.print(table)
    console.print(
        "KV GB/s = bytes of K+V read / time; read = a read-only pass over the same pages; "
        "copy = np.copyto on a buffer of the same size, counting read + write bytes; "
        "torch SDPA reads the same keys and values as dense float32 whatever the pool's dtype."
    )
    if len(dtypes) > 1:
        _print_dtype_comparison(console, comparisons, dtypes, batches, contexts, repeats)
    if comparisons.row_count:
        console.print(comparisons)
    if specs:
        console.print(
            "xp = the array-namespace kernel (backends/xp_kernels.py) on that backend; "
            "x numba = its time / the Numba kernel's time in the same run (>1: slower)."
        )


def _print_dtype_comparison(
    console: Any,
    comparisons: Any,
    dtypes: list[str],
    batches: list[int],
    contexts: list[int],
    repeats: int,
) -> None:
    """The paged kernel over each dtype's copy of the same K/V, timed interleaved, and each
    dtype's speed over float16's as comparison rows."""
    from rich.table import Table

    from pagedattn.bench.kv_dtypes import kv_dtype_comparisons, kv_dtype_decode_ms

    table = Table(title=f"decode attention by KV dtype, interleaved, median of {repeats} rounds")
    for name in ("batch", "context", *(f"{d} ms" for d in dtypes)):
        table.add_column(name, justify="right")
    for b, c in itertools.product(batches, contexts):
        ms = kv_dtype_decode_ms(b, c, repeats, dtypes)
        table.add_row(str(b), str(c), *(f"{ms[d]:.3f}" for d in dtypes))
        for label, value in kv_dtype_comparisons(ms):
            comparisons.add_row(f"batch {b}, context {c}", label, value)
    console.print(table)
