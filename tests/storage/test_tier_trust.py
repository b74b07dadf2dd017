"""What the tier trusts: pages are named by the weights themselves (no fingerprint given, two
models never restore each other's pages), disk records are refused from their size before any
read, and with a shared key only records signed with it are used."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import pagedattn.cli.generate  # noqa: F401  (registers the command)
from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.cli.app import app
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from pagedattn.storage import PageKey
from pagedattn.storage.disk import DiskStore
from pagedattn.storage.record import encode_record
from tests.engine.helpers import drain, tiny_model, tokens

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 250, 37)]
PS = 4
KEY = "a shared secret of the tier, 32+"


def _engine(model: Any, kv_store: str | None, **options: Any) -> LLMEngine:
    config = EngineConfig(
        cache=CacheConfig(page_size=PS, num_pages=64), kv_store=kv_store, **options
    )
    return LLMEngine(config, model)  # no model_fingerprint: named by its weights


def _run(engine: LLMEngine) -> tuple[list[int], int]:
    outs = drain(engine, {0: [("r", PROMPT, GREEDY)]})["r"]
    engine.close()
    return tokens(outs), outs[-1].num_cached_tokens


def test_two_models_sharing_a_store_never_restore_each_other(tmp_path: Path) -> None:
    a, b = tiny_model(seed=0), tiny_model(seed=1)
    scratch_a, scratch_b = _run(_engine(a, None)), _run(_engine(b, None))
    assert scratch_a[0] != scratch_b[0]  # the two models answer differently
    assert _run(_engine(a, str(tmp_path))) == scratch_a
    b_first = _engine(b, str(tmp_path))
    assert _run(b_first) == scratch_b  # nothing of a's is restored: b computes all
    assert b_first.get_stats()["tier_restored_tokens"] == 0
    assert _run(_engine(b, str(tmp_path)))[1] == 36  # b restores its own pages
    assert _run(_engine(a, str(tmp_path))) == (scratch_a[0], 36)  # and a its own
    same_weights = tiny_model(seed=0)  # another object, the same weights: the same name
    assert _run(_engine(same_weights, str(tmp_path))) == (scratch_a[0], 36)
    namespaces = {_engine(m, None).namespace for m in (a, b, same_weights)}
    assert len(namespaces) == 2


def test_a_model_without_readable_weights_needs_a_fingerprint(tmp_path: Path) -> None:
    class Opaque:
        config = tiny_model().config

        def forward(self, batch: Any, kv: Any) -> Any:
            raise AssertionError("never run")

    with pytest.raises(ValueError, match="model_fingerprint"):
        _engine(Opaque(), str(tmp_path))
    first, second = _engine(Opaque(), None), _engine(Opaque(), None)
    assert first.namespace != second.namespace  # without a tier: shared with nobody


def _written(tmp_path: Path, **options: Any) -> tuple[list[int], LLMEngine, list[Path]]:
    model = tiny_model()
    scratch, _ = _run(_engine(model, None))
    writer = _engine(model, str(tmp_path), **options)
    assert _run(writer) == (scratch, 0)
    pool = writer.page_pool
    shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)
    store = DiskStore(tmp_path, writer.namespace, shape)
    paths = [store.path_of(h) for h in prefix_page_hashes(PROMPT, PS, writer.namespace)]
    return scratch, writer, paths


@pytest.mark.parametrize("size", [1 << 30, 64 << 30, 100])
def test_a_record_of_the_wrong_size_is_refused_unread(tmp_path: Path, size: int) -> None:
    scratch, _, paths = _written(tmp_path)
    with paths[3].open("r+b") as f:  # sparse: costs no disk, but reading it costs `size`
        f.truncate(size)
    reader = _engine(tiny_model(), str(tmp_path))
    assert _run(reader) == (scratch, 12)  # pages 0-2 restored, the rest recomputed
    assert reader.get_stats()["kv_store"]["errors"] == {"size": 1}
    assert paths[3].stat().st_size < 1 << 20  # deleted, then written again whole


def _forge(writer: LLMEngine, path: Path, page: int, sign_with: bytes | None) -> None:
    """A record of page ``page`` with other KV and a valid checksum (as anyone who can write
    the store could make), over the real one."""
    hashes = prefix_page_hashes(PROMPT, PS, writer.namespace)
    key = PageKey(hashes[page], hashes[page - 1], tuple(PROMPT[page * PS : (page + 1) * PS]))
    pool = writer.page_pool
    shape = (pool.num_layers, 2, pool.num_kv_heads, pool.page_size, pool.head_dim)
    kv = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    path.write_bytes(encode_record(writer.namespace, key, kv, sign_with=sign_with))


def test_without_a_key_a_forged_record_is_used(tmp_path: Path) -> None:
    """What a store without a key must be trusted for: the KV it serves."""
    scratch, writer, paths = _written(tmp_path)
    _forge(writer, paths[3], 3, None)
    reader = _engine(tiny_model(), str(tmp_path))
    answer, cached = _run(reader)
    assert cached == 36 and reader.get_stats()["kv_store"]["errors"] == {}
    assert answer != scratch  # the forged KV changed the answer


@pytest.mark.parametrize("forgery", ["unsigned", "another key"])
def test_with_a_key_forged_records_are_refused(tmp_path: Path, forgery: str) -> None:
    scratch, writer, paths = _written(tmp_path, kv_store_key=KEY)
    signer = None if forgery == "unsigned" else b"another secret, also 32 bytes.."
    _forge(writer, paths[3], 3, signer)
    reader = _engine(tiny_model(), str(tmp_path), kv_store_key=KEY)
    assert _run(reader) == (scratch, 12)
    assert reader.get_stats()["kv_store"]["errors"] == {"signature": 1}
    again = _engine(tiny_model(), str(tmp_path), kv_store_key=KEY)  # rewritten, signed
    assert _run(again) == (scratch, 36)
    keyless = _engine(tiny_model(), str(tmp_path))  # signed records still check out
    assert _run(keyless) == (scratch, 36)
    unsigned_store = _engine(tiny_model(), str(tmp_path / "other"))
    _run(unsigned_store)  # an unsigned tier: a keyed reader uses none of it
    keyed = _engine(tiny_model(), str(tmp_path / "other"), kv_store_key=KEY)
    assert _run(keyed) == (scratch, 0)
    stats = keyed.get_stats()["kv_store"]
    assert stats["pages_hit"] == 0 and set(stats["errors"]) == {"signature"}


def test_a_short_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kv_store_key: expected at least 16 bytes"):
        _engine(tiny_model(), str(tmp_path), kv_store_key="short")


def test_generate_signs_with_the_key_option_or_the_environment(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    runner = CliRunner()
    args = ["generate", "tell me about cats and dogs", "-m", str(tiny_gguf), "--page-size", "4"]
    args += ["--max-tokens", "6", "--ignore-eos", "--stats", "--kv-store", str(tmp_path)]
    first = runner.invoke(app, [*args, "--kv-store-key", KEY])
    assert first.exit_code == 0, first.stderr
    records = sorted((tmp_path / "kv").rglob("*.page"))
    assert records and all(p.read_bytes()[10] & 2 for p in records)  # flags: signed
    env = {"PAGEDATTN_KV_STORE_KEY": KEY}
    second = runner.invoke(app, args, env=env)
    assert second.exit_code == 0 and second.stdout == first.stdout
    assert "prompt tokens from the kv store: 0" not in second.stderr
    wrong = runner.invoke(app, args, env={"PAGEDATTN_KV_STORE_KEY": "x" * 32})
    assert wrong.exit_code == 0 and wrong.stdout == first.stdout
    assert "prompt tokens from the kv store: 0" in wrong.stderr  # nothing of theirs is used
    short = runner.invoke(app, [*args, "--kv-store-key", "short"])
    assert short.exit_code == 1 and "--kv-store-key" in short.stderr
    os.environ.pop("PAGEDATTN_KV_STORE_KEY", None)
