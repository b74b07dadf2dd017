"""A store whose reads a test holds, and the engines and requests the waiting-for-KV tests
share: a store filled by one engine, a reader behind a held store, streams that decode while a
restore waits."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.cache.hashing import PageKey
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.engine.outputs import RequestOutput
from pagedattn.sampling_params import SamplingParams
from pagedattn.storage import KVStore, StoredPage
from pagedattn.storage.disk import DiskStore
from tests.engine.helpers import drain, tiny_model, tokens

PS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
STREAM = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
rng = np.random.default_rng(21)
PROMPT = [int(t) for t in rng.integers(3, 250, 37)]  # 9 full pages before the last token
OTHER = [int(t) for t in rng.integers(3, 250, 37)]
# no full page before their last token: nothing to restore, both run from their first step
STREAMS = {rid: [int(t) for t in rng.integers(3, 250, n)] for rid, n in (("a", 3), ("b", 4))}
MODEL = tiny_model(seed=4)
HELD_S = 60.0  # a held read waits at most this long (a test that fails must not hang)


class HeldStore:
    """A store whose page reads wait until ``release`` is set (a stalled network)."""

    def __init__(self, store: KVStore) -> None:
        self.store = store
        self.namespace = store.namespace
        self.release = threading.Event()
        self.entered = threading.Event()  # a read is waiting on ``release``
        self.returned = threading.Event()  # a held read returned

    def contains(self, page_hashes: Sequence[bytes]) -> list[bool]:
        return self.store.contains(page_hashes)

    def get(self, keys: Sequence[PageKey]) -> list[np.ndarray | None]:
        self.entered.set()
        self.release.wait(HELD_S)
        try:
            return self.store.get(keys)
        finally:
            self.returned.set()

    def put(self, pages: Sequence[StoredPage]) -> int:
        return self.store.put(pages)

    def get_document(self, name: str) -> bytes | None:
        return self.store.get_document(name)

    def put_document(self, name: str, data: bytes) -> None:
        self.store.put_document(name, data)

    def replace_document(self, name: str, old: bytes | None, new: bytes) -> None:
        self.store.replace_document(name, old, new)

    def stats(self) -> dict[str, Any]:
        return self.store.stats()

    def close(self) -> None:
        self.release.set()
        self.store.close()


def config(**options: Any) -> EngineConfig:
    return EngineConfig(cache=CacheConfig(page_size=PS, num_pages=64), **options)


def page_shape(engine: LLMEngine) -> tuple[int, ...]:
    pool = engine.page_pool
    return (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)


def stored(tmp_path: Path) -> tuple[bytes, tuple[int, ...]]:
    """Fill a disk store with PROMPT's and OTHER's pages; its namespace and page shape."""
    writer = LLMEngine(config(kv_store=str(tmp_path)), MODEL)
    drain(writer, {0: [("r", PROMPT, GREEDY), ("o", OTHER, GREEDY)]})
    writer.close()
    return writer.namespace, page_shape(writer)


def held_reader(tmp_path: Path, deadline_s: float = HELD_S) -> tuple[LLMEngine, HeldStore]:
    namespace, shape = stored(tmp_path)
    store = HeldStore(DiskStore(tmp_path, namespace, shape))
    return LLMEngine(config(kv_store_deadline_s=deadline_s), MODEL, kv_store=store), store


def cold(prompt: list[int], params: SamplingParams = GREEDY, model: Any = MODEL) -> list[int]:
    return tokens(drain(LLMEngine(config(), model), {0: [("c", prompt, params)]})["c"])


def by_request(outs: Sequence[RequestOutput]) -> dict[str, list[RequestOutput]]:
    got: dict[str, list[RequestOutput]] = {}
    for out in outs:
        got.setdefault(out.request_id, []).append(out)
    return got


def start_streams(engine: LLMEngine) -> list[RequestOutput]:
    """Run the streams' prompts and sample their first tokens (one step)."""
    for rid, prompt in STREAMS.items():
        engine.add_request(prompt, STREAM, request_id=rid)
    outs = engine.step()
    assert sorted(by_request(outs)) == ["a", "b"]
    return list(outs)


def decode_while_waiting(
    engine: LLMEngine, held: threading.Event | None, steps: int
) -> list[RequestOutput]:
    """Start the restore of PROMPT; while its read is held on the store (``held``: set once
    the read is there), the streams get one token each per step and the restoring request
    nothing."""
    outs: list[RequestOutput] = []
    engine.add_request(PROMPT, GREEDY, request_id="r")
    outs += engine.step()  # its restore starts; the streams decode
    assert held is None or held.wait(HELD_S), "the restore never read the store"
    for _ in range(steps):
        step = engine.step()
        got = by_request(step)
        assert sorted(got) == ["a", "b"], "only the running streams produced output"
        assert all(len(tokens(got[rid])) == 1 for rid in got)
        assert step.report.num_seqs == 2 and step.report.num_tier_restored_tokens == 0
        assert engine.get_stats()["num_waiting_for_kv"] == 1
        outs += step
    return outs
