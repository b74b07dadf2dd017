"""`pagedattn` command line: demo | generate | chat | serve |
bench {kernels, generate, engine, store, structured} | eval ppl | profile.

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
    """Import every command module; importing one registers its commands on ``app``."""
    from pagedattn.cli import (  # noqa: F401
        bench_engine,
        bench_generate,
        bench_kernels,
        bench_store,
        bench_structured,
        chat,
        demo,
        eval,
        generate,
        profile,
        serve,
    )
