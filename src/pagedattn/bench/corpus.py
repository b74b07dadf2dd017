"""Benchmark and eval text cut from real prose: the Jane Austen novel shipped as package data,
or any UTF-8 text file given with ``--prompt-file`` / ``--text``."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

CORPUS_FILE = "prideprejudice.txt"


def default_corpus_file() -> Path:
    """The public-domain novel shipped inside the package (``pagedattn/data/prideprejudice.txt``,
    see ``pagedattn/data/README.md``), so benchmarks and ``pagedattn eval`` work from a wheel.

    Raises:
        FileNotFoundError: the package data is missing (a broken install; pass a text file).
    """
    path = Path(str(files("pagedattn") / "data" / CORPUS_FILE))
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus {CORPUS_FILE} missing from the installed package ({path}); "
            "reinstall pagedattn or pass a text file"
        )
    return path


def corpus_token_ids(tokenizer: Any, path: Path | None, min_tokens: int) -> list[int]:
    """Token ids of (a prefix of) a text file, at least ``min_tokens`` of them.

    Reads the file in growing prefixes so a long novel is not tokenized whole.

    Raises:
        FileNotFoundError: no file. ValueError: the file holds fewer than ``min_tokens`` tokens.
    """
    path = default_corpus_file() if path is None else path
    text = path.read_text(encoding="utf-8", errors="replace")
    size = 8 * min_tokens
    while True:
        ids: list[int] = tokenizer.encode(text[:size], add_special_tokens=False)
        if len(ids) >= min_tokens:
            return ids
        if size >= len(text):
            raise ValueError(f"{path}: expected at least {min_tokens} tokens, found {len(ids)}")
        size *= 2


def sample_prompts(
    ids: Sequence[int], num_prompts: int, min_len: int, max_len: int, seed: int
) -> list[list[int]]:
    """``num_prompts`` disjoint windows of ``ids`` with lengths uniform in [min_len, max_len].

    Raises:
        ValueError: bad lengths, or ``ids`` too short for the windows.
    """
    if not 1 <= min_len <= max_len:
        raise ValueError(f"prompt lengths: expected 1 <= min <= max, got {min_len}, {max_len}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=num_prompts)
    if int(lengths.sum()) > len(ids):
        raise ValueError(f"corpus: {len(ids)} tokens, expected >= {int(lengths.sum())}")
    prompts, start = [], 0
    for n in lengths.tolist():
        prompts.append(list(ids[start : start + n]))
        start += n
    return prompts


def shared_prefix_prompts(
    prompts: Sequence[Sequence[int]], prefix: Sequence[int]
) -> list[list[int]]:
    """Each prompt with its first half replaced by the same ``prefix`` (truncated to that half),
    so half of every prompt is a prefix common to all of them.

    Raises:
        ValueError: ``prefix`` shorter than half the longest prompt.
    """
    need = max(len(p) // 2 for p in prompts)
    if len(prefix) < need:
        raise ValueError(f"prefix: expected >= {need} tokens, got {len(prefix)}")
    return [list(prefix[: len(p) // 2]) + list(p[len(p) // 2 :]) for p in prompts]


def load_tokenizer(model: str | None) -> Any:
    """The tokenizer of a model without loading its weights (GGUF metadata or tokenizer.json).

    Raises:
        FileNotFoundError: no such model. ValueError: an unsupported tokenizer.
    """
    from pagedattn.model.gguf_loader import gguf_tokenizer_metadata, open_gguf
    from pagedattn.model.tokenizer import Tokenizer

    path = resolve_model_path(model)
    if path.is_dir():
        return Tokenizer.from_folder(path)
    return Tokenizer.from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)))


def resolve_model_path(model: str | None) -> Path:
    """The model file or folder (None = the embedded GGUF; a model name = its installed file); a
    folder holding exactly one .gguf and no config.json resolves to that file.

    Raises:
        FileNotFoundError: no such path or installed model, or the embedded model is not
            installed.
    """
    from pagedattn.model.catalogue import resolve_model

    path = resolve_model(model)
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    return path
