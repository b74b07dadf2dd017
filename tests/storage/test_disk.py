"""DiskStore: round trip across restarts, every bad record a counted miss that is deleted and
never executed, atomic writes, LRU size cap by mtime, two processes sharing one directory."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from pagedattn.storage.disk import DiskStore
from pagedattn.storage.record import encode_record
from tests.storage.pages import PAGE_SHAPE, chain, namespace, pages

TOKENS = list(range(100, 132))  # 8 full pages


def _store(root: Path, model: str = "model-a", **kwargs: object) -> DiskStore:
    return DiskStore(root, namespace(model), PAGE_SHAPE, **kwargs)  # type: ignore[arg-type]


def test_round_trip_survives_restart(tmp_path: Path) -> None:
    store = _store(tmp_path)
    written = pages(TOKENS, store.namespace)
    assert store.put(written) > 0
    store.close()
    again = _store(tmp_path)  # a new process would see the same
    got = again.get([p.key for p in written])
    assert all(
        g is not None and g.tobytes() == p.kv.tobytes() for g, p in zip(got, written, strict=False)
    )
    assert again.contains([p.key.page_hash for p in written]) == [True] * len(written)
    s = again.stats()
    assert s["pages_hit"] == len(written) and s["bytes_read"] > 0 and s["errors"] == {}


def test_missing_and_vanished_records_are_plain_misses(tmp_path: Path) -> None:
    store = _store(tmp_path)
    written = pages(TOKENS, store.namespace)
    store.put(written[:2])
    os.unlink(store.path_of(written[0].key.page_hash))  # another process evicted it
    assert store.get([p.key for p in written[:3]])[0] is None
    assert store.get([written[2].key]) == [None]
    assert store.stats()["errors"] == {}


class _Payload:
    """Unpickling this would create ``marker``: proves a record is never unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("damage", ["truncated", "checksum", "bad_magic", "namespace"])
def test_bad_records_are_counted_deleted_and_never_executed(tmp_path: Path, damage: str) -> None:
    store = _store(tmp_path)
    page = pages(TOKENS, store.namespace)[3]
    path = store.path_of(page.key.page_hash)
    store.put([page])
    data = path.read_bytes()
    marker = tmp_path / "executed"
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "checksum":
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(flipped))
    elif damage == "bad_magic":
        path.write_bytes(pickle.dumps(_Payload(marker)))
    else:  # another model's record under this page's name
        other = namespace("model-b")
        path.write_bytes(encode_record(other, chain(TOKENS, other)[3], page.kv))
    assert store.get([page.key]) == [None]
    # a file of another size than a page record's is refused from its size, unread
    kind = "size" if damage in ("truncated", "bad_magic") else damage
    assert store.stats()["errors"] == {kind: 1}
    assert not path.exists()
    assert not marker.exists()
    store.put([page])  # rewritten fresh, it is served again
    got = store.get([page.key])[0]
    assert got is not None and got.tobytes() == page.kv.tobytes()


def test_failed_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path)
    written = pages(TOKENS, store.namespace)

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    assert store.put(written[:2]) == 0
    monkeypatch.undo()
    assert store.stats()["errors"] == {"io": 2}
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    store.put(written)
    files = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == len(written) and all(f.endswith(".page") for f in files)


def test_size_cap_evicts_least_recently_used_by_mtime_across_restart(tmp_path: Path) -> None:
    store = _store(tmp_path)
    written = pages(TOKENS, store.namespace)
    size = len(encode_record(store.namespace, written[0].key, written[0].kv))
    store.put(written[:4])
    for age, page in enumerate(written[:4]):  # page 0 oldest ... page 3 newest
        t = 1_000_000 + age
        os.utime(store.path_of(page.key.page_hash), (t, t))
    store.close()
    capped = _store(tmp_path, max_bytes=int(size * 4.5))  # a restart: recency from mtimes
    assert capped.get([written[0].key])[0] is not None  # a hit makes page 0 the newest
    capped.put(written[4:5])  # 5 records > cap: evict down to 90 % (4 records): page 1 goes
    present = capped.contains([p.key.page_hash for p in written[:5]])
    assert present == [True, False, True, True, True]
    assert capped.stats()["pages_evicted"] == 1


def _writer(root: str, seed: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = _store(Path(root))
    written = pages(TOKENS, store.namespace, seed=0)  # both write the same pages
    for _ in range(5):
        store.put(written)
        got = store.get([p.key for p in written])
        if any(
            g is not None and g.tobytes() != p.kv.tobytes()
            for g, p in zip(got, written, strict=False)
        ):
            out.put("bad")
            return
        for p in written[seed::2]:  # and delete some under the other process
            p_path = store.path_of(p.key.page_hash)
            if p_path.exists():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p_path)
    out.put(store.stats()["errors"])


def test_two_processes_write_the_same_pages(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), s, out)) for s in (0, 1)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert results == [{}, {}]  # no torn or foreign record was ever read
    store = _store(tmp_path)
    written = pages(TOKENS, store.namespace)
    store.put(written)
    got = store.get([p.key for p in written])
    assert all(
        g is not None and np.array_equal(g, p.kv) for g, p in zip(got, written, strict=False)
    )
    assert not [p for p in tmp_path.rglob(".tmp-*")]
