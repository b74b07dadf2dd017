"""`pagedattn` command line: demo | generate | chat | serve | models | pull |
bench {kernels, generate, engine, spec, store, structured} | eval {ppl, report} | profile.

Each subcommand lives in its own module and imports heavy dependencies lazily,
so `pagedattn --help` stays fast; `pagedattn NAME ...` imports only NAME's modules.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Sequence

from pagedattn.cli.app import app

#: The modules of the package that register each top-level command or group on ``app``
#: (importing one registers its commands; all of them, in this order, list the commands in
#: `pagedattn --help` in the order of their modules' names).
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "bench": (
        "bench_engine",
        "bench_generate",
        "bench_kernels",
        "bench_spec",
        "bench_store",
        "bench_structured",
    ),
    "chat": ("chat",),
    "demo": ("demo",),
    "eval": ("eval", "eval_report"),
    "generate": ("generate",),
    "models": ("models",),
    "pull": ("models",),
    "profile": ("profile",),
    "serve": ("serve",),
}


def main() -> None:
    """Console-script entry point.

    On the way out (any exit, SystemExit included) every surviving object is moved to the
    collector's permanent generation (``gc.freeze``), so the interpreter's final collections do
    not walk Numba's and LLVM's large object graphs: that walk took ~0.3 s of every command's
    exit on a 2-core machine (``generate "Hi" --max-tokens 1``: 2.3 -> 2.0 s wall). Nothing
    else changes at exit: atexit handlers run, standard streams are flushed, objects freed by
    reference counting are finalized; the commands close their own files and connections.
    """
    _register(sys.argv[1:2])
    try:
        app()
    finally:
        gc.freeze()


def _register(names: Sequence[str] = ()) -> None:
    """Register the commands ``names`` (top-level command or group names, as in
    :data:`COMMAND_MODULES`) on ``app``, or every command when one is not such a name or none
    is given (help, an unknown command: typer then lists them all).

    Typer builds every registered command's parser before it dispatches (~40 ms for all of
    them), so ``pagedattn generate ...`` registers generate alone.
    """
    wanted = [COMMAND_MODULES.get(name) for name in names]
    if not wanted or None in wanted:
        wanted = list(COMMAND_MODULES.values())
    for modules in wanted:
        for module in modules or ():
            importlib.import_module(f"pagedattn.cli.{module}")
