"""`pagedattn` command line: demo | generate | chat | bench.

Each subcommand lives in its own module and imports heavy dependencies lazily,
so `pagedattn --help` stays fast.
"""

from __future__ import annotations

from pagedattn.cli.app import app


def main() -> None:
    """Console-script entry point."""
    _register()
    app()


def _register() -> None:
    # Importing a module registers its commands on `app` / `bench_app`.
    import importlib
    import pkgutil

    import pagedattn.cli as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name != "app":
            importlib.import_module(f"pagedattn.cli.{info.name}")
