"""The shape check every loader runs (names and shapes from :mod:`.architecture`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pagedattn.config import ModelConfig
from pagedattn.model.architecture import expected_weight_shapes
from pagedattn.model.quantized import BlockQuantized

__all__ = ["check_weights", "expected_weight_shapes"]


def check_weights(
    config: ModelConfig, weights: Mapping[str, np.ndarray | BlockQuantized], source: str
) -> None:
    """Check that ``weights`` holds every tensor ``config`` implies, with the right shape.

    Args:
        config: the model shape read from the file's metadata.
        weights: tensors by Hugging Face name (float32 arrays or GGUF block forms).
        source: the file or folder they came from, quoted in errors.

    Raises:
        ValueError: a tensor is missing, or its shape disagrees with the metadata; the message
            names the tensor, the expected and the actual shape.
    """
    for name, shape in expected_weight_shapes(config).items():
        if name not in weights:
            raise ValueError(f"{source}: missing tensor {name!r} (expected shape {shape})")
        if weights[name].shape != shape:
            raise ValueError(
                f"{source}: tensor {name!r} has shape {weights[name].shape}, but the metadata "
                f"implies {shape}"
            )
