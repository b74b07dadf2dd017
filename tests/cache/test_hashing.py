"""Prefix hashing: chaining, exact tokens, namespace separation, cross-process stability."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pagedattn.cache.hashing import (
    HASH_NBYTES,
    cache_namespace,
    hash_page_tokens,
    prefix_page_hashes,
)


def _ns(**overrides: object) -> bytes:
    fields: dict[str, object] = dict(
        model_fingerprint="tiny-llama@abc",
        dtype="float32",
        page_size=4,
        num_layers=2,
        num_kv_heads=3,
        head_dim=8,
        rope_theta=10000.0,
    )
    fields.update(overrides)
    return cache_namespace(**fields)  # type: ignore[arg-type]


def test_chain_depends_on_every_earlier_token() -> None:
    ns = _ns()
    a = prefix_page_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, ns)
    b = prefix_page_hashes([1, 2, 3, 0, 5, 6, 7, 8], 4, ns)
    assert len(a) == 2 and len(b) == 2  # trailing partial page skipped
    assert all(len(h) == HASH_NBYTES for h in a)
    assert a[0] != b[0] and a[1] != b[1]  # page 1 tokens equal, parent differs
    assert a[1] == hash_page_tokens(a[0], [5, 6, 7, 8], ns)
    assert a[0] == hash_page_tokens(None, np.array([1, 2, 3, 4], np.int32), ns)


def test_namespace_fields_separate_hashes() -> None:
    base = _ns()
    for change in (
        {"model_fingerprint": "other"},
        {"dtype": "float16"},
        {"page_size": 8},
        {"num_layers": 3},
        {"num_kv_heads": 1},
        {"head_dim": 16},
        {"rope_theta": 500000.0},
        {"sliding_window": 64},
        {"num_sink_tokens": 4},
        {"position_mode": "shifted"},
        {"layout_version": 2},
    ):
        ns = _ns(**change)
        assert ns != base, change
        assert hash_page_tokens(None, [1, 2, 3, 4], ns) != hash_page_tokens(
            None, [1, 2, 3, 4], base
        )


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="page_size"):
        _ns(page_size=0)
    with pytest.raises(ValueError, match="dtype"):
        _ns(dtype="not-a-dtype")
    with pytest.raises(ValueError, match="16 bytes"):
        hash_page_tokens(b"short", [1], b"ns")
    with pytest.raises(ValueError, match="integers"):
        hash_page_tokens(None, [1.5, 2.0], b"ns")


def test_hash_is_stable_across_processes() -> None:
    code = (
        "from pagedattn.cache.hashing import hash_page_tokens;"
        "print(hash_page_tokens(None, [7, 8, 9, 10], b'ns').hex())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outs == {hash_page_tokens(None, [7, 8, 9, 10], b"ns").hex()}
