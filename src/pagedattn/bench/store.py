"""`pagedattn bench store`: time to first token of one long prompt recomputed vs restored from
the disk tier vs from Redis, and the tier's write throughput vs raw file writes (same run).

Each TTFT is measured on a fresh engine (an empty page pool, as after a restart) built on the
already loaded model: recompute = no tier; restored = the prompt's full pages come from the
tier (written by a warm-up run), only the last token is computed. Write throughput puts the
prompt's pages synchronously (``KVStore.put``: encode, checksum, tmp + fsync + rename per
page) and compares it with writing the same bytes to one file with one fsync.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pagedattn.cache.hashing import PageKey
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from pagedattn.storage import KVStore, StoredPage, open_store

FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def _ttft(engine: LLMEngine, prompt: list[int]) -> tuple[float, int]:
    """Seconds from arrival to first token, and the prompt tokens not computed."""
    engine.add_request(prompt, FIRST_TOKEN, request_id="bench")
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out
    assert final is not None and final.metrics.first_token_time is not None
    return final.metrics.first_token_time - final.metrics.arrival_time, final.num_cached_tokens


def _raw_write_bps(data: list[bytes], folder: Path) -> float:
    """Bytes/s writing ``data`` to one file with one fsync (the disk's plain bandwidth)."""
    path = folder / "raw.bin"
    t0 = time.perf_counter()
    with path.open("wb") as f:
        for chunk in data:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return sum(map(len, data)) / seconds


def run_store_bench(
    loaded: Any,
    prompt: list[int],
    *,
    page_size: int,
    repeats: int,
    redis_url: str | None,
    workdir: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Measure (see the module doc).

    Args:
        loaded: ``pagedattn.model.loader.LoadedModel``.
        prompt: the prompt's token ids.
        page_size: tokens per page; repeats: TTFT runs per row (median reported).
        redis_url: ``redis://...`` for the Redis rows, None to skip them.
        workdir: where the disk tier lives (default: a temporary directory, removed after).

    Returns:
        ``{"prompt_tokens", "page_size", "rows": {name: {"ttft_s", "cached_tokens"[,
        "errors"]}},
        "write": {name: {"bytes_s", "pages"}}, "raw_write_bytes_s"}``.
    """
    from pagedattn.model.llama import LlamaModel

    model = LlamaModel.from_loaded(loaded)
    pages = -(-len(prompt) // page_size) + 2
    mib = pages * loaded.config.num_layers * 2 * loaded.config.num_kv_heads * page_size
    mib = mib * loaded.config.head_dim * 4 / 2**20
    config = EngineConfig(cache=CacheConfig(page_size=page_size, kv_cache_mib=mib))
    own_dir = workdir is None
    folder = Path(tempfile.mkdtemp(prefix="pagedattn-bench-store-")) if own_dir else workdir
    assert folder is not None

    def engine(store: KVStore | None) -> LLMEngine:
        return LLMEngine(
            config, model, loaded.tokenizer, model_fingerprint=loaded.fingerprint, kv_store=store
        )

    def store_for(spec: str) -> KVStore:
        probe = engine(None)
        pool = probe.page_pool
        shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.row_width)
        return open_store(spec, probe.namespace, shape)

    rows: dict[str, dict[str, Any]] = {}
    write: dict[str, dict[str, Any]] = {}
    specs = {"disk": str(folder / "tier")}
    if redis_url is not None:
        specs["redis"] = redis_url
    try:
        progress("recompute")
        runs = [_ttft(engine(None), prompt) for _ in range(repeats)]
        rows["recompute"] = {"ttft_s": statistics.median(r[0] for r in runs), "cached_tokens": 0}
        for name, spec in specs.items():
            progress(f"{name}: write")
            warm = engine(store_for(spec))
            _ttft(warm, prompt)
            written = _page_snapshot(warm, prompt, page_size)
            warm.close()
            progress(f"{name}: restore")
            runs, errors = [], {}
            for _ in range(repeats):
                restoring = engine(store_for(spec))
                runs.append(_ttft(restoring, prompt))
                errors.update(restoring.get_stats()["kv_store"]["errors"])
                restoring.close()
            rows[name] = {
                "ttft_s": statistics.median(r[0] for r in runs),
                "cached_tokens": min(r[1] for r in runs),
                "errors": errors,
            }
            store = store_for(spec)
            if name == "disk":  # time fresh files, not skipped existing ones
                shutil.rmtree(folder / "tier")
                store = store_for(spec)
            t0 = time.perf_counter()
            nbytes = store.put(written)
            write[name] = {"bytes_s": nbytes / (time.perf_counter() - t0), "pages": len(written)}
            store.close()
        progress("raw write")
        data = [p.kv.tobytes() for p in written] if specs else []
        raw = _raw_write_bps(data, folder)
    finally:
        if own_dir:
            shutil.rmtree(folder, ignore_errors=True)
    return {
        "prompt_tokens": len(prompt),
        "page_size": page_size,
        "rows": rows,
        "write": write,
        "raw_write_bytes_s": raw,
    }


def measure(args: dict[str, Any], progress: Callable[[str, int, int], None]) -> dict[str, Any]:
    """Worker entry (``pagedattn.bench.worker``, which sets numba and BLAS threads): load
    ``args["model"]``, cut ``args["prompt_len"]`` tokens from ``args["prompt_file"]`` and run
    :func:`run_store_bench`. Returns its figures plus ``model_name`` and ``threads``."""
    import numba

    from pagedattn.bench.corpus import corpus_token_ids
    from pagedattn.model.loader import load_model

    loaded = load_model(args["model"])
    prompt_file = Path(args["prompt_file"]) if args["prompt_file"] else None
    prompt = corpus_token_ids(loaded.tokenizer, prompt_file, args["prompt_len"])
    steps = iter(range(1, 100))
    figures = run_store_bench(
        loaded,
        prompt[: args["prompt_len"]],
        page_size=args["page_size"],
        repeats=args["repeats"],
        redis_url=args["redis_url"],
        progress=lambda what: progress(what, next(steps), 0),
    )
    figures["model_name"] = loaded.source.name
    figures["threads"] = numba.get_num_threads()
    return figures


def _page_snapshot(engine: LLMEngine, prompt: list[int], page_size: int) -> list[StoredPage]:
    """The prompt's full pages as the warm engine holds them (for the write measurement)."""
    from pagedattn.cache.hashing import prefix_page_hashes

    hashes = prefix_page_hashes(prompt, page_size, engine.namespace)
    out = []
    for i, h in enumerate(hashes):
        page_id = engine.cache_manager.allocator.page_of(h)
        key = PageKey(
            h, hashes[i - 1] if i else None, tuple(prompt[i * page_size : (i + 1) * page_size])
        )
        out.append(StoredPage(key, engine.page_pool.read_page(page_id)))
    return out
