"""The typer applications every subcommand module registers itself on."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import typer
from typer import core as typer_core


def _untyped(kind: Any) -> Any:
    """A copy of the click type ``kind`` whose metavar is empty: typer shows an argument's
    type as ``<str>`` when its type's metavar is None, and nothing when it is ""."""
    plain = copy.copy(kind)
    plain.get_metavar = lambda param, ctx=None: ""
    return plain


def _plain_metavar(param: Any) -> None:
    """Give an option without a metavar its plain one: "" for a flag, the upper-case type
    name for a value (typer's ``<int>`` becomes ``INT``); an argument shows no type."""
    if isinstance(param, typer_core.TyperArgument):
        param.type = _untyped(param.type)
        return
    if param.metavar is not None or not isinstance(param, typer_core.TyperOption):
        return
    if param.is_flag:
        param.metavar = ""
        return
    # what typer shows: the type's own metavar (choices: "a|b"), else <its name>
    shown = param.type.get_metavar(param=param, ctx=cast(Any, None)) or f"<{param.type.name}>"
    if shown.startswith("<") and shown.endswith(">"):
        param.metavar = shown[1:-1].upper()


class PlainHelpCommand(typer_core.TyperCommand):
    """A command whose help shows each option's metavar (``N``, ``PATH``...), else its type in
    upper case (``INT``, ``STR``), and nothing for a flag, instead of typer's placeholders
    (``<bool>``, ``<str>``, ``<int>``), and no type for an argument: each parameter of this
    command is set up so once, when the command is built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _plain_metavar(param)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            _plain_metavar(option)
        return option


class PlainHelpTyper(typer.Typer):
    """A typer application whose commands are :class:`PlainHelpCommand` unless told."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        kwargs.setdefault("cls", PlainHelpCommand)
        return super().command(*args, **kwargs)


app = PlainHelpTyper(
    name="pagedattn",
    help="CPU-first paged-attention inference engine.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = PlainHelpTyper(
    help="Benchmarks, reported as ratios against a reference measured in the same run.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")
