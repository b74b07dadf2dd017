"""What a bench command and a same-run comparison share: the worker arguments of the generate
and engine measurements (one prompt cut from real prose; many prompts, optionally sharing a
prefix), and running several sides one after another under one progress display.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pagedattn.bench.worker import TASKS, run_worker


def generate_args(
    model: str | None,
    prompt_file: Path | None,
    *,
    prompt_len: int,
    output_len: int,
    repeats: int,
    threads: int,
    activations: str,
    kv_cache_dtype: str,
) -> tuple[Path, dict[str, Any]]:
    """The model file and the worker arguments of one single-stream measurement.

    Raises:
        ValueError: a size below its minimum, a corpus too short, a bad model path.
    """
    from pagedattn.bench.corpus import corpus_token_ids, load_tokenizer, resolve_model_path

    if prompt_len < 1 or output_len < 2 or repeats < 1 or threads < 1:
        raise ValueError(
            "expected --prompt-len >= 1, --output-len >= 2, --repeats >= 1, --threads >= 1"
        )
    path = resolve_model_path(model)
    ids = corpus_token_ids(load_tokenizer(model), prompt_file, prompt_len)[:prompt_len]
    return path, {
        "model": str(path),
        "model_path": str(path),
        "prompt_ids": ids,
        "output_len": output_len,
        "repeats": repeats,
        "activations": activations,
        "kv_cache_dtype": kv_cache_dtype,
    }


def engine_args(
    model: str | None,
    prompt_file: Path | None,
    *,
    num_requests: int,
    min_prompt_len: int,
    max_prompt_len: int,
    output_len: int,
    threads: int,
    seed: int,
    shared_prefix: bool,
    **options: Any,
) -> tuple[Path, dict[str, Any]]:
    """The model file and the worker arguments of one offline-throughput measurement:
    ``prompts`` (disjoint windows of the corpus), ``shared_prompts`` (the same with a common
    first half, or empty), ``pad_token_id`` and every keyword of ``options`` as given.

    Raises:
        ValueError: a count below 1, a corpus too short, a bad model path.
    """
    from pagedattn.bench.corpus import (
        corpus_token_ids,
        load_tokenizer,
        resolve_model_path,
        sample_prompts,
        shared_prefix_prompts,
    )

    for name, value in (
        ("num-requests", num_requests),
        ("output-len", output_len),
        ("threads", threads),
    ):
        if value < 1:
            raise ValueError(f"--{name}: expected an int >= 1, got {value}")
    path = resolve_model_path(model)
    tokenizer = load_tokenizer(model)
    ids = corpus_token_ids(tokenizer, prompt_file, num_requests * max_prompt_len + max_prompt_len)
    prompts = sample_prompts(
        ids[max_prompt_len:], num_requests, min_prompt_len, max_prompt_len, seed
    )
    shared = shared_prefix_prompts(prompts, ids[:max_prompt_len]) if shared_prefix else []
    pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    return path, {
        "model": str(path),
        "model_path": str(path),
        "prompts": prompts,
        "shared_prompts": shared,
        "output_len": output_len,
        "pad_token_id": pad,
        **options,
    }


def progress_display(console: Any) -> Any:
    """A transient ``rich.progress.Progress`` on ``console``: phase, bar, done/total, time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    return Progress(*columns, TimeElapsedColumn(), console=console, transient=True)


def run_sides(
    progress: Any,
    sides: Sequence[tuple[str, str]],
    args: dict[str, Any],
    threads: int,
    *,
    tasks: Mapping[str, str] = TASKS,
    pythonpath: Sequence[str | Path] = (),
) -> dict[str, dict[str, Any]]:
    """Run each ``(side, task)`` in its own worker process, one after another, with a bar on
    ``progress`` each; return side -> result.

    Raises:
        RuntimeError: a worker failed (its last stderr line).
    """
    results: dict[str, dict[str, Any]] = {}
    for side, task in sides:
        bar = progress.add_task(f"{side}: loading", total=None)

        def update(phase: str, done: int, total: int, bar: Any = bar) -> None:
            progress.update(bar, description=phase, completed=done, total=total)

        results[side] = run_worker(task, args, threads, update, tasks=tasks, pythonpath=pythonpath)
    return results
