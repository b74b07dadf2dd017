"""The typer applications every subcommand module registers itself on."""

from __future__ import annotations

from typing import Any

import typer
from typer import core as typer_core

app = typer.Typer(
    name="pagedattn",
    help="CPU-first paged-attention inference engine.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(
    help="Benchmarks, reported as ratios against a reference measured in the same run.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")


def _plain_placeholders() -> None:
    """Help shows an option's metavar (``N``, ``PATH``...), else its type in click's style
    (``INT``, ``PATH``), and nothing for a flag or a named argument, instead of typer's
    placeholders (``<bool>``, ``<str>``, ``<int>``). Typer offers no per-app setting for this,
    so its two display hooks are wrapped once, here."""
    option_display = typer_core.TyperOption.display_type_rich
    argument_display = typer_core.TyperArgument.display_type_rich

    def option_type(self: Any, ctx: Any) -> str | None:
        if self.metavar is None and self.is_flag:
            return None
        shown = option_display(self, ctx)
        if shown is not None and shown.startswith("<") and shown.endswith(">"):
            return shown[1:-1].upper()
        return shown

    def argument_type(self: Any, ctx: Any) -> str | None:
        return None if self.metavar is not None else argument_display(self, ctx)

    typer_core.TyperOption.display_type_rich = option_type  # type: ignore[method-assign]
    typer_core.TyperArgument.display_type_rich = argument_type  # type: ignore[method-assign]


_plain_placeholders()
