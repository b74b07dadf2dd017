"""``activations="int8"`` on a file that mixes block types within a layer, as llama.cpp's Q4_K_M
files do (Q6_K matrices beside Q5_0 and Q8_0 ones): the fused decode step keeps running, every
matrix on int8 inputs as :func:`~pagedattn.model.quantized.qmatmul` runs it, bitwise equal to
the step-by-step forward and near the exact path's logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import pagedattn.model.decoder as decoder
from pagedattn.kernels.target import has_avx2
from pagedattn.model.decoder import DecoderModel
from pagedattn.model.loader import load_model
from pagedattn.model.weights import expected_weight_shapes
from tests.model.paging import PagedSequences
from tests.model.random_blocks import random_blocks
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

pytestmark = pytest.mark.skipif(not has_avx2(), reason="int8 activations need AVX2")

CONFIG = tiny_config(
    hidden_size=256,
    intermediate_size=512,
    head_dim=64,
    num_layers=3,
    tie_word_embeddings=False,
)
SCALES = {Q.Q4_0: 4e-3, Q.Q4_1: 4e-3, Q.Q8_0: 2e-4, Q.Q5_0: 4e-3, Q.Q5_1: 4e-3,
          Q.Q4_K: 2e-4, Q.Q5_K: 1e-4, Q.Q6_K: 5e-5}  # fmt: skip
# per layer, the types of q, k, v, o, gate, up, down: groups (q|k|v, gate|up) of mixed types,
# a group of one type, a layer of Q6_K only
MIXED = (
    (Q.Q6_K, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q6_K, Q.Q4_0, Q.Q4_K),
    (Q.Q8_0, Q.Q8_0, Q.Q8_0, Q.Q6_K, Q.Q5_1, Q.Q4_K, Q.Q5_K),
    (Q.Q6_K,) * 7,
)
ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _write(path: Path, layers: tuple[tuple[Q, ...], ...], head: Q) -> Path:
    rng = np.random.default_rng(7)
    shapes = expected_weight_shapes(CONFIG)
    types = {"model.embed_tokens.weight": Q.Q6_K, "lm_head.weight": head}
    for i, row in enumerate(layers):
        for role, qtype in zip(ROLES, row, strict=True):
            part = "self_attn" if role in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            types[f"model.layers.{i}.{part}.{role}.weight"] = qtype
    blocks: dict[str, tuple[np.ndarray, Q]] = {}
    for name, qtype in types.items():
        n, k = shapes[name]
        raw = random_blocks(qtype, (n, k), rng, SCALES[qtype], centred=True)
        blocks[name] = (raw, qtype)
    return write_tiny_gguf(path, CONFIG, random_weights(CONFIG), stored=blocks)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("int8-mixed")
    return {"mixed": _write(root / "mixed.gguf", MIXED, Q.Q6_K)}


def _decode_logits(model: DecoderModel, prompt: list[int], steps: int) -> np.ndarray:
    """The logits of ``steps`` one-row decode steps after a prefill of ``prompt``."""
    state = PagedSequences(model, num_pages=16, page_size=4)
    seq = state.new_sequence()
    state.step({seq: prompt})
    tokens = [int(t) for t in np.random.default_rng(1).integers(3, CONFIG.vocab_size, steps)]
    return np.stack([state.step({seq: [t]})[0] for t in tokens])


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    real = decoder.decode_layer
    monkeypatch.setattr(decoder, "decode_layer", lambda *a: calls.append(a) or real(*a))
    return calls


def test_mixed_types_keep_the_fused_step_bitwise_the_general_path(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_model(files["mixed"])
    fused = DecoderModel.from_loaded(loaded, "int8")
    plain = DecoderModel(loaded.config, loaded.weights, loaded.quantized, "int8",
                         fused_decode=False)  # fmt: skip
    exact = DecoderModel.from_loaded(loaded)
    calls = _counting(monkeypatch)
    prompt = [5, 9, 14, 20, 3, 7, 11]
    got = _decode_logits(fused, prompt, 6)
    assert len(calls) == 6 * CONFIG.num_layers  # every decode step took the fused layer
    assert {call[16] for call in calls} == {True}  # decode_layer(..., int8, ...): int8 inputs
    np.testing.assert_array_equal(got, _decode_logits(plain, prompt, 6))
    # the int8 parts did meet int8 inputs: not the exact path's logits, but near them (random
    # blocks of random bytes amplify the rounding layer by layer: each step's logits correlate)
    want = _decode_logits(exact, prompt, 6)
    assert not np.array_equal(got, want)
    assert all(np.corrcoef(g, w)[0, 1] > 0.8 for g, w in zip(got, want, strict=True))


@pytest.mark.model
def test_the_real_qwen_q4_k_m_file_keeps_the_fused_int8_step() -> None:
    """Qwen2.5-Coder-0.5B Q4_K_M (when pulled): Q5_0, Q8_0, Q4_K and Q6_K matrices (ffn_down in
    some layers) on int8 inputs; int8 decode steps take the fused layer, bitwise the general
    path's."""
    from pagedattn.model.catalogue import resolve_model

    try:
        path = resolve_model("qwen2.5-coder-0.5b")
    except (FileNotFoundError, ValueError):
        pytest.skip("qwen2.5-coder-0.5b is not pulled")
    loaded = load_model(path)
    fused = DecoderModel.from_loaded(loaded, "int8")
    plain = DecoderModel(loaded.config, loaded.weights, loaded.quantized, "int8",
                         fused_decode=False)  # fmt: skip
    downs = {layer.down.type_name for layer in fused.layers}
    assert downs >= {"Q6_K"}  # ffn_down: Q6_K in some layers
    prompt = loaded.tokenizer.encode("def quicksort(items):")
    outs = []
    for model in (fused, plain):
        state = PagedSequences(model, num_pages=8, page_size=16)
        seq = state.new_sequence()
        state.step({seq: prompt})
        outs.append(np.stack([state.step({seq: [t]})[0] for t in prompt[:3]]))
    np.testing.assert_array_equal(outs[0], outs[1])
