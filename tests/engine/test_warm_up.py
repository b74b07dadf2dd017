"""The warm-up compiles or loads every kernel signature a first request dispatches.

Each case runs :mod:`tests.engine.warm_up_worker` in a fresh process (so that no earlier test
loaded a signature the warm-up missed): the engine of the embedded model is built and warmed up
(or, for the server, ``build_app`` does it), every Numba dispatcher's signatures are recorded,
and a first request of each kind a user sends must add none (a chat-length prompt, a single
token, a prompt chunked in two and its prefix-cache hit, a copy task that drafts and verifies,
twenty sequences at once, sampling with logprobs and ``n`` = 2, a JSON schema; for the server a
chat completion, streamed and not, and one with ``response_format``). The configurations whose
kernels differ: the KV pool's dtype (float32, float16, int8) and int8 activations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedattn.kernels.target import has_avx2

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.model


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "added.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.engine.warm_up_worker", str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict = json.loads(out.read_text())
    return result


def _assert_nothing_added(result: dict) -> None:
    kinds = result["kinds"]
    assert len(kinds) >= 3
    assert {kind: added for kind, added in kinds.items() if added} == {}


def test_default_engine_first_requests_dispatch_only_warm_signatures(tmp_path: Path) -> None:
    result = _run(tmp_path)
    _assert_nothing_added(result)
    # the warm-up itself drafted (its verify step ran), and so did the copy task
    assert result["warm_up_drafted"] > 0
    assert result["drafted"] > 0
    # and the engine's counters start at zero for the user's requests
    assert result["steps_after_warm_up"] == 0 and result["finished_after_warm_up"] == {}


def test_server_answers_its_first_requests_with_warm_kernels(tmp_path: Path) -> None:
    _assert_nothing_added(_run(tmp_path, "--server"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "option",
    [
        "kv_cache_dtype=float16",
        "kv_cache_dtype=int8",
        pytest.param(
            "activations=int8",
            marks=pytest.mark.skipif(not has_avx2(), reason="int8 activations need AVX2"),
        ),
    ],
)
def test_each_kernel_variant_is_warm_before_its_first_request(option: str, tmp_path: Path) -> None:
    _assert_nothing_added(_run(tmp_path, option))
