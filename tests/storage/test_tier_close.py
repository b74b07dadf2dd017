"""Closing the tier: ``LLM`` flushes its queued writes on ``close()`` / ``with``, and the server
closes the tier only after its engine thread has stopped, never under a running step."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm import LLM
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.engine_loop import AsyncEngine
from pagedattn.storage.disk import DiskStore
from tests.engine.helpers import tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = [int(t) for t in np.random.default_rng(13).integers(3, 250, 37)]
PS = 4


class SlowDiskStore(DiskStore):
    """A disk store whose writes take a while (a slow disk or network)."""

    def put(self, pages: Any) -> int:
        time.sleep(0.3)
        return super().put(pages)


def _engine(model: Any, root: Path, store_cls: type[DiskStore] = SlowDiskStore) -> LLMEngine:
    config = EngineConfig(cache=CacheConfig(page_size=PS, num_pages=64))
    probe = LLMEngine(config, model)
    pool = probe.page_pool
    shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)
    store = store_cls(root, probe.namespace, shape)
    return LLMEngine(config, model, kv_store=store)


def _records(engine: LLMEngine, root: Path) -> list[bool]:
    store = DiskStore(root, engine.namespace, (1, 1, 1, PS, 1))
    return [store.path_of(h).is_file() for h in prefix_page_hashes(PROMPT, PS, engine.namespace)]


def test_llm_close_and_with_flush_the_queued_writes(tmp_path: Path) -> None:
    model = tiny_model()
    for how in ("with", "close"):
        root = tmp_path / how
        engine = _engine(model, root)
        if how == "with":
            with LLM(engine=engine) as llm:
                llm.generate(PROMPT, GREEDY, use_tqdm=False)
        else:
            llm = LLM(engine=engine)
            llm.generate(PROMPT, GREEDY, use_tqdm=False)
            llm.close()
            llm.close()  # idempotent
        # 37 prompt + 5 fed-back tokens = 42 computed: the 9 prompt pages (and one more)
        assert _records(engine, root) == [True] * 9
        reader = _engine(model, root, DiskStore)
        out = LLM(engine=reader).generate(PROMPT, GREEDY, use_tqdm=False)[0]
        assert out.num_cached_tokens == 36
        reader.close()


class _GatedModel:
    """The tiny model whose forward waits for ``gate`` (a step that outlives stop's timeout)."""

    def __init__(self) -> None:
        self.inner = tiny_model()
        self.config = self.inner.config
        self.gate = threading.Event()
        self.entered = threading.Event()

    def forward(self, batch: Any, kv: Any) -> Any:
        self.entered.set()
        self.gate.wait(30)
        return self.inner.forward(batch, kv)


class _RecordingStore(DiskStore):
    def __init__(self, *args: Any, model: _GatedModel, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model = model
        self.closed = False
        self.closed_while_stepping = False

    def put(self, pages: Any) -> int:
        assert not self.closed, "a write after the tier was closed"
        return super().put(pages)

    def close(self) -> None:
        if self.model.entered.is_set() and not self.model.gate.is_set():
            self.closed_while_stepping = True
        self.closed = True


def test_the_tier_closes_only_after_the_engine_thread_stopped(tmp_path: Path) -> None:
    model = _GatedModel()
    config = EngineConfig(cache=CacheConfig(page_size=PS, num_pages=64))
    probe = LLMEngine(config, model.inner)
    pool = probe.page_pool
    shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)
    store = _RecordingStore(tmp_path, probe.namespace, shape, model=model)
    engine = LLMEngine(config, model, model_fingerprint="gated", kv_store=store)
    async_engine = AsyncEngine(engine)
    async_engine.start()

    async def submit() -> None:
        async for _ in async_engine.generate(PROMPT, GREEDY, "r"):
            pass

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=lambda: loop.run_until_complete(_quiet(submit())))
    runner.start()
    assert model.entered.wait(30)  # the engine thread is inside a forward
    async_engine.stop(timeout_s=0.2, then=engine.close)  # times out: the step still runs
    assert not store.closed  # not under the running step
    model.gate.set()
    runner.join(30)
    deadline = time.monotonic() + 30
    while not store.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.closed and not store.closed_while_stepping  # closed once the step was over
    assert engine.get_stats()["kv_store"]["writes_failed"] == 0  # nothing written after it
    loop.close()


async def _quiet(coro: Any) -> None:
    with contextlib.suppress(Exception):  # stop() aborts the request: not what is tested
        await coro
