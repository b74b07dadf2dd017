"""RedisStore against a real redis-server: round trip, TTL and per-namespace keys, bad values,
server killed / restarted / paused (circuit breaker), maxmemory eviction."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import redis

from pagedattn.storage.redis_store import RedisStore
from tests.redis_server import RedisServer
from tests.storage.pages import PAGE_SHAPE, all_equal, namespace, pages

TOKENS = list(range(100, 132))


def _store(server: RedisServer, model: str = "model-a", **kwargs: object) -> RedisStore:
    kwargs = {"timeout_s": 0.25, "cooldown_s": 0.3, **kwargs}
    return RedisStore(server.url, namespace(model), PAGE_SHAPE, **kwargs)  # type: ignore[arg-type]


def test_round_trip_keys_ttl_and_namespaces(redis_server: RedisServer) -> None:
    store = _store(redis_server, ttl_s=600)
    written = pages(TOKENS, store.namespace)
    assert store.put(written) > 0
    got = store.get([p.key for p in written])
    assert all_equal(got, written)
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    key = store.key(written[0].key.page_hash)
    assert key.startswith(f"pagedattn:{store.namespace.hex()}:page:")
    assert 0 < client.ttl(key) <= 600
    other = _store(redis_server, "model-b")  # another model: its own key space, all misses
    assert other.get([p.key for p in written]) == [None] * len(written)
    assert other.contains([p.key.page_hash for p in written]) == [False] * len(written)
    s = store.stats()
    assert s["up"] and s["pages_hit"] == len(written) and s["errors"] == {}


def test_documents(redis_server: RedisServer) -> None:
    store = _store(redis_server)
    assert store.get_document("chat-1") is None
    store.put_document("chat-1", b'{"a": 1}')
    assert store.get_document("chat-1") == b'{"a": 1}'
    with pytest.raises(ValueError, match="document name"):
        store.get_document("../etc/passwd")


def test_bad_value_is_counted_and_deleted(redis_server: RedisServer) -> None:
    store = _store(redis_server)
    page = pages(TOKENS, store.namespace)[2]
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    size = min(store.record_sizes)  # a record's size, not a record's bytes
    client.set(store.key(page.key.page_hash), b"\x80\x04\x95 not ours".ljust(size, b"\0"))
    assert store.get([page.key]) == [None]
    assert store.stats()["errors"] == {"bad_magic": 1}
    assert client.exists(store.key(page.key.page_hash)) == 0
    client.set(store.key(page.key.page_hash), b"\x80\x04\x95 not ours")  # no record's size
    assert store.get([page.key]) == [None]
    assert store.stats()["errors"] == {"bad_magic": 1, "size": 1}
    assert client.exists(store.key(page.key.page_hash)) == 0


def test_killed_then_restarted_server(redis_server: RedisServer) -> None:
    store = _store(redis_server)
    written = pages(TOKENS, store.namespace)
    store.put(written)
    redis_server.kill()
    assert store.get([p.key for p in written]) == [None] * len(written)
    assert store.stats()["up"] is False
    assert store.put(written) == 0  # refused at once while the breaker is open
    assert store.stats()["errors"].get("circuit_open", 0) >= 1
    redis_server.start()  # same port, empty (no persistence)
    time.sleep(0.4)  # past the cool-down: the next call probes and closes the breaker
    assert store.get([written[0].key]) == [None]  # the restarted server is empty
    assert store.stats()["up"] is True
    store.put(written)
    got = store.get([p.key for p in written])
    assert all_equal(got, written)


def test_paused_server_costs_at_most_one_timeout(redis_server: RedisServer) -> None:
    store = _store(redis_server, timeout_s=0.2, cooldown_s=60)
    written = pages(TOKENS, store.namespace)
    store.put(written)
    redis_server.pause()
    try:
        t0 = time.monotonic()
        assert store.get([p.key for p in written]) == [None] * len(written)
        for _ in range(20):  # the open breaker answers without touching the socket
            assert store.get([written[0].key]) == [None]
        elapsed = time.monotonic() - t0
    finally:
        redis_server.resume()
    assert store.stats()["errors"].get("timeout") == 1
    assert elapsed < 5.0  # one 0.2 s timeout, not 21 of them (a liveness bound, not speed)


def test_maxmemory_eviction_is_a_miss(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = RedisServer(tmp_path_factory.mktemp("redis-lru"), maxmemory="1mb")
    try:
        store = _store(server)
        tokens = list(range(4 * 3000))  # 3000 pages of ~1.2 KB: more than 1 MB
        written = pages(tokens, store.namespace)
        for i in range(0, len(written), 100):
            store.put(written[i : i + 100])
        got = store.get([p.key for p in written])
        hits = [g for g in got if g is not None]
        assert 0 < len(hits) < len(written)  # some were evicted, some are still there
        for g, p in zip(got, written, strict=True):
            assert g is None or g.tobytes() == p.kv.tobytes()
        assert store.stats()["errors"] == {}
    finally:
        server.stop()


def _redis_writer(url: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = RedisStore(url, namespace(), PAGE_SHAPE, timeout_s=5.0)
    written = pages(TOKENS, store.namespace)  # both processes write the same pages
    ok = True
    for _ in range(20):
        store.put(written)
        got = store.get([p.key for p in written])
        ok = ok and all(
            g is None or g.tobytes() == p.kv.tobytes() for g, p in zip(got, written, strict=True)
        )
    out.put((ok, store.stats()["errors"]))


def test_two_processes_write_the_same_pages(redis_server: RedisServer) -> None:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_redis_writer, args=(redis_server.url, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert results == [(True, {}), (True, {})]
    store = _store(redis_server)
    written = pages(TOKENS, store.namespace)
    assert all_equal(store.get([p.key for p in written]), written)


def _bytes_sent(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def test_oversized_values_are_counted_misses_never_read_whole(redis_server: RedisServer) -> None:
    store = _store(redis_server, timeout_s=5.0)
    written = pages(TOKENS, store.namespace)
    store.put(written)
    client = redis.Redis.from_url(redis_server.url, socket_timeout=30)
    huge = b"\0" * (64 * 1024 * 1024)
    client.set(store.key(written[1].key.page_hash), huge)
    before = _bytes_sent(client)
    got = store.get([p.key for p in written])
    sent = _bytes_sent(client) - before
    assert got[1] is None and all_equal([got[0], *got[2:]], [written[0], *written[2:]])
    assert store.stats()["errors"] == {"size": 1}
    assert client.exists(store.key(written[1].key.page_hash)) == 0
    # every record once, plus at most one byte past a record for the oversized value
    assert sent < len(written) * max(store.record_sizes) + 64 * 1024
    client.set("pagedattn:doc:session-big", huge)
    before = _bytes_sent(client)
    with pytest.raises(ValueError, match="more than the"):
        store.get_document("session-big")
    assert _bytes_sent(client) - before < 17 * 1024 * 1024  # the 16 MiB bound, not 64 MiB
    assert store.stats()["errors"]["document_size"] == 1


def test_replace_document_is_compare_and_swap(redis_server: RedisServer) -> None:
    from pagedattn.storage.documents import DocumentConflictError

    one, two = _store(redis_server), _store(redis_server)  # two servers, one Redis
    one.replace_document("chat-2", None, b"first")
    with pytest.raises(DocumentConflictError):
        two.replace_document("chat-2", None, b"second")  # read before "first" was saved
    two.replace_document("chat-2", b"first", b"second")
    with pytest.raises(DocumentConflictError):
        one.replace_document("chat-2", b"first", b"third")
    assert one.get_document("chat-2") == b"second"
