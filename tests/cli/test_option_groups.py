"""An option group (a dataclass of typer options) reaches a command as one value: each field
is a flag in the parameter's place, a command may omit fields or change their defaults, and a
group that cannot fit the command is refused when the command is declared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from pagedattn.cli.option_groups import option_group


@dataclass(frozen=True)
class Pool:
    pages: Annotated[int, typer.Option(metavar="N", help="Pages.", rich_help_panel="Pool")] = 4
    dtype: Annotated[str, typer.Option(metavar="D", help="Dtype.", rich_help_panel="Pool")] = "f32"
    window: Annotated[int | None, typer.Option(metavar="W", help="Window.")] = None


def run(app: typer.Typer, *args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, list(args))
    return result.exit_code, result.stdout


def test_a_group_is_expanded_into_flags_and_handed_over_as_one_value() -> None:
    seen: list[tuple[str, Pool, bool]] = []
    app = typer.Typer()

    @app.command()
    @option_group(Pool, omit=("window",), pages=8)
    def main(name: Annotated[str, typer.Argument()], *, pool: Pool, loud: bool = False) -> None:
        seen.append((name, pool, loud))

    assert run(app, "a")[0] == 0
    assert seen.pop() == ("a", Pool(pages=8, dtype="f32", window=None), False)
    assert run(app, "b", "--pages", "3", "--dtype", "f16", "--loud")[0] == 0
    assert seen.pop() == ("b", Pool(pages=3, dtype="f16", window=None), True)
    code, _ = run(app, "c", "--window", "2")  # omitted: not a flag of this command
    assert code == 2 and not seen
    code, out = run(app, "--help")
    assert code == 0
    assert "[default: 8]" in out and "--window" not in out and "─ Pool ─" in out
    assert out.index("--pages") < out.index("--dtype")  # field order


def test_a_group_that_does_not_fit_the_command_is_refused() -> None:
    with pytest.raises(TypeError, match="no field"):
        option_group(Pool, omit=("pagez",))
    with pytest.raises(TypeError, match="no field"):
        option_group(Pool, pagez=1)

    def without(name: str) -> None: ...

    with pytest.raises(TypeError, match="one parameter of type Pool"):
        option_group(Pool)(without)

    def shadowing(pages: int, *, pool: Pool) -> None: ...

    with pytest.raises(TypeError, match=r"\['pages'\] shadow"):
        option_group(Pool)(shadowing)
    option_group(Pool, omit=("pages",))(shadowing)  # omitted: no clash
