"""`pagedattn bench kernels`: decode attention, paged kernel vs copy bandwidth and torch SDPA."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedattn.cli.app import bench_app


@bench_app.command("kernels")
def bench_kernels(
    repeats: Annotated[int, typer.Option(min=1, help="Timed calls per measurement (median).")] = 20,
    batch: Annotated[
        list[int] | None, typer.Option(min=1, help="Batch size; repeat for several.")
    ] = None,
    context: Annotated[
        list[int] | None, typer.Option(min=1, help="KV tokens per sequence; repeat for several.")
    ] = None,
) -> None:
    """Decode attention (9 q heads, 3 kv heads, head_dim 64, fp32, page_size 16, shuffled pages)."""
    import numba
    from rich.console import Console
    from rich.table import Table

    from pagedattn.bench.kernels import TORCH_HINT, bench_decode

    console = Console()
    batches = batch or [1, 32]
    contexts = context or [512, 2048, 8192]
    try:
        import torch  # noqa: F401

        has_torch = True
    except ImportError:
        has_torch = False
        console.print(TORCH_HINT)

    table = Table()
    for name in ("batch", "context", "paged ms", "KV GB/s", "copy GB/s (r+w)", "% copy"):
        table.add_column(name, justify="right")
    if has_torch:
        table.add_column("torch SDPA ms", justify="right")
        table.add_column("speedup", justify="right")
    for b in batches:
        for c in contexts:
            r = bench_decode(b, c, repeats)
            row = [
                str(b),
                str(c),
                f"{r.paged_ms:.3f}",
                f"{r.kv_gbps:.1f}",
                f"{r.copy_gbps:.1f}",
                f"{r.pct_copy:.0f}%",
            ]
            if has_torch and r.torch_ms is not None and r.speedup is not None:
                row += [f"{r.torch_ms:.3f}", f"{r.speedup:.2f}x"]
            table.add_row(*row)
    layer = numba.threading_layer()  # type: ignore[attr-defined]
    table.title = (
        f"decode attention, {numba.get_num_threads()} threads "
        f"(numba threading layer {layer}), median of {repeats}"
    )
    console.print(table)
    console.print(
        "KV GB/s = bytes of K+V read / time; copy = np.copyto on a buffer of the same size, "
        "counting read + write bytes."
    )
