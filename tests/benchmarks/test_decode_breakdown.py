"""``benchmarks/decode_breakdown.py`` runs its timers on the tiny model stored as Q8_0 blocks
(the fused decode layer's weights), exact and with int8 activations (llama.cpp's row only
where llama_cpp is importable)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from benchmarks import decode_breakdown
from pagedattn.model.int8_ir import int8_unsupported
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_q8_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tiny_config()
    path = tmp_path_factory.mktemp("tiny-q8-0") / "tiny-q8_0.gguf"
    return write_tiny_gguf(path, config, random_weights(config, seed=1), qtype=Q.Q8_0)


@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_decode_breakdown_times_the_step_and_its_parts(
    activations: str,
    tiny_q8_0: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if activations == "int8" and int8_unsupported() is not None:
        pytest.skip("int8 activations need AVX2")
    argv = ["decode_breakdown.py", "--context", "24", "--rounds", "2", "--threads", "1",
            "--activations", activations, "-m", str(tiny_q8_0)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    decode_breakdown.main()
    out = capsys.readouterr().out
    assert f"activations {activations}" in out
    times = {
        line.split()[0]: float(line.split()[1])
        for line in out.splitlines()
        if line.startswith("  ") and len(line.split()) == 2
    }
    assert times["step"] > 0 and times["matmuls"] > 0 and times["attention"] > 0
