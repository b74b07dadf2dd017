"""``activations="int8"``: block-quantized projections on int8-quantized inputs (llama.cpp's
q8_1 scheme), an explicit option; checked against a NumPy float64 oracle of
``W @ dequant(quant(x))``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import pagedattn.cli.generate  # noqa: F401  (registers the command)
from pagedattn.backends import BackendSpec
from pagedattn.cli.app import app
from pagedattn.config import EngineConfig
from pagedattn.engine.llm import LLM
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.kernels.target import has_avx2
from pagedattn.model import int8_ir
from pagedattn.model.build import build_model
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from pagedattn.model.quantized import from_gguf_blocks, qmatmul
from pagedattn.sampling_params import SamplingParams
from tests.model.random_blocks import random_blocks
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.skipif(not has_avx2(), reason="int8 activations need AVX2")


def _q8_1_dequantized(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_1, dequantized: per 32 inputs d = max|x| / 127, q = round(x / d)
    (as float32 x * (1 / d)), back to d * q; float64 out."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, 1, d))
    q = np.rint(blocks * inv.astype(np.float32))
    return (d.astype(np.float64) * q).reshape(x.shape)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9),
    out=st.integers(1, 37),
    blocks=st.integers(1, 5),
    qtype=st.sampled_from([Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1]),
    seed=st.integers(0, 2**16),
)
def test_int8_path_is_w_times_the_q8_1_input(
    rows: int, out: int, blocks: int, qtype: Q, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    k = 32 * blocks
    w = from_gguf_blocks(
        quantize(rng.standard_normal((out, k)).astype(np.float32), qtype), qtype.name, (out, k)
    )
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[:, 3] *= 30  # an outlier channel, as real activations have
    got = qmatmul(x, w, activations="int8")
    want = _q8_1_dequantized(x) @ w.dequantize().astype(np.float64).T
    scale = np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64).T
    assert np.max(np.abs(got - want) / scale) < 1e-5
    for t in range(rows):  # batch-invariant on this path too
        np.testing.assert_array_equal(qmatmul(x[t : t + 1], w, activations="int8")[0], got[t])


def test_q4k_meets_the_q8_1_input_sub_block_by_sub_block() -> None:
    """Each 32-input sub-block of a Q4_K matrix meets a q8_1 block of the input as a Q4_1
    block would, so int8 activations apply to it: ``gguf``'s dequantized weights times the
    q8_1 input, as for Q4_1."""
    rng = np.random.default_rng(5)
    raw = random_blocks(Q.Q4_K, (12, 512), rng, centred=True)
    w = from_gguf_blocks(raw, "Q4_K", (12, 512))
    dense = dequantize(raw, Q.Q4_K).reshape(12, 512).astype(np.float64)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[:, 5] *= 30
    got = qmatmul(x, w, activations="int8")
    want = _q8_1_dequantized(x) @ dense.T
    scale = np.abs(x).astype(np.float64) @ np.abs(dense).T
    assert np.max(np.abs(got - want) / scale) < 1e-5
    assert not np.array_equal(got, qmatmul(x, w))  # not the exact path


def test_float_parts_stay_exact_beside_int8_block_parts() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    q8 = from_gguf_blocks(
        quantize(rng.standard_normal((5, 64)).astype(np.float32), Q.Q8_0), "Q8_0", (5, 64)
    )
    dense = rng.standard_normal((4, 64)).astype(np.float32)
    got = qmatmul(x, q8, dense, activations="int8")
    np.testing.assert_array_equal(got[:, 5:], qmatmul(x, dense))
    want = _q8_1_dequantized(x) @ q8.dequantize().astype(np.float64).T  # Q8_0 x int8, as ggml
    np.testing.assert_allclose(got[:, :5], want, rtol=1e-5, atol=1e-5)
    assert np.abs(got[:, :5] - qmatmul(x, q8)).max() > 0  # not the exact path


def test_unknown_or_unsupported_activations_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.zeros((1, 32), np.float32)
    w = np.zeros((2, 32), np.float32)
    with pytest.raises(ValueError, match=r"activations: expected one of \('float32', 'int8'\)"):
        qmatmul(x, w, activations="int4")
    with pytest.raises(ValueError, match=r"EngineConfig\.activations"):
        EngineConfig(activations="bf16")
    monkeypatch.setattr(int8_ir, "has_avx2", lambda: False)
    with pytest.raises(ValueError, match="int8 needs a CPU with AVX2"):
        qmatmul(x, w, activations="int8")


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tiny_config()
    path = tmp_path_factory.mktemp("q4") / "tiny-q4_1.gguf"
    return write_tiny_gguf(path, config, random_weights(config), qtype=Q.Q4_1)


def test_engine_runs_int8_in_its_own_cache_namespace(q4_gguf: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, ignore_eos=True)
    prompt = [5, 9, 14, 20, 3, 7, 11]
    exact, int8 = LLM(str(q4_gguf)), LLM(str(q4_gguf), activations="int8")
    a, b = (llm.generate([prompt], params)[0].outputs[0] for llm in (exact, int8))
    assert len(b.token_ids) == 8 and b.logprobs is not None and a.logprobs is not None
    first_a, first_b = a.logprobs[0], b.logprobs[0]
    shared = [t for t in first_a if t in first_b]
    deviation = max(abs(first_a[t].logprob - first_b[t].logprob) for t in shared)
    assert 0 < deviation < 0.5  # a different, nearby computation
    assert exact.engine.namespace != int8.engine.namespace  # never share prefix pages


def test_engine_refuses_a_model_of_the_other_mode(q4_gguf: Path) -> None:
    loaded = load_model(q4_gguf)
    model = LlamaModel.from_loaded(loaded, activations="int8")
    with pytest.raises(ValueError, match="the model computes with int8, the engine config asks"):
        LLMEngine(EngineConfig(), model, loaded.tokenizer)
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="runs on the numpy backend only"):
        build_model(loaded, BackendSpec("torch", "cpu"), activations="int8")


def test_cli_generate_takes_activations(q4_gguf: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["generate", "hi", "-m", str(q4_gguf), "--max-tokens", "3",
                             "--activations", "int8", "--raw"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(app, ["generate", "hi", "-m", str(q4_gguf), "--activations", "int4"])
    assert bad.exit_code != 0 and "activations" in bad.stderr
    assert bad.stderr.count("\n") == 1
