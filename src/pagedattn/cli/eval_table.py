"""The perplexity lab's table on stdout (`eval ppl` and `eval report`)."""

from __future__ import annotations

from typing import Any


def print_table(records: list[dict[str, Any]], markdown: bool = False) -> None:
    """The (policy, KV dtype) x budget table (perplexity, ratio to full) on stdout, drawn by
    rich or, with ``markdown``, as a Markdown pipe table."""
    from rich.console import Console
    from rich.table import Table

    from pagedattn.eval.report import table_rows

    tokens = sorted({r["tokens"] for r in records})
    header, rows = table_rows(records)
    if markdown:
        for line in (header, ["---"] * len(header), *rows):
            print("| " + " | ".join(line) + " |")
        return
    table = Table(
        title=f"perplexity over {', '.join(map(str, tokens))} tokens "
        "(ratio to full with float32 KV)"
    )
    for h in header:
        table.add_column(h)
    for row in rows:
        table.add_row(*row)
    Console().print(table)
