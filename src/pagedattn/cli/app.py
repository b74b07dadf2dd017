"""The typer applications every subcommand module registers itself on."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import typer
from typer import core as typer_core


class _PlainArgument(typer_core.TyperArgument):
    """An argument whose help row shows no type (its name says what it is)."""

    def display_type_rich(self, ctx: Any) -> str | None:  # typer >= 0.29
        return None


def _untyped(kind: Any) -> Any:
    """A copy of the click type ``kind`` whose metavar is empty: typer < 0.29 shows an
    argument's type as ``<str>`` when its metavar is None, and nothing when it is ""."""
    plain = copy.copy(kind)
    plain.get_metavar = lambda param, ctx=None: ""
    return plain


def _plain_metavar(param: Any) -> None:
    """Give an option without a metavar its plain one: "" for a flag, the upper-case type
    name for a value (typer's ``<int>`` becomes ``INT``); an argument shows no type."""
    if type(param) is typer_core.TyperArgument:
        param.__class__ = _PlainArgument
        param.type = _untyped(param.type)
        return
    if param.metavar is not None or not isinstance(param, typer_core.TyperOption):
        return
    if param.is_flag:
        param.metavar = ""
        return
    display = getattr(param, "display_type_rich", None)  # typer >= 0.29
    if display is not None:
        shown = display(cast(Any, None))  # no context: the type alone
    else:  # typer < 0.29 shows the type's metavar, else <its name>
        shown = param.type.get_metavar(param=param, ctx=cast(Any, None))
        shown = shown or f"<{param.type.name}>"
    if shown is not None and shown.startswith("<") and shown.endswith(">"):
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
