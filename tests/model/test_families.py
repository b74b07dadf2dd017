"""Every family of the architecture table against HF transformers, through both loaders.

For each family a tiny random transformers model (tests/model/families.py) is saved as an HF
folder and written as a GGUF with llama.cpp's names and conventions. Our logits must be within
1e-4 of HF's on a prompt several times longer than the sliding window, fed as prefill chunks;
greedy decoding through the engine (chunked prefill, then decode; two requests batched, and each
alone) must give HF's greedy tokens. A GGUF written with the other q/k convention must fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.engine.fingerprint import weights_fingerprint
from pagedattn.engine.llm import LLM
from pagedattn.model.architecture import architecture
from pagedattn.model.decoder import DecoderModel
from pagedattn.model.loader import LoadedModel, load_model
from pagedattn.sampling_params import SamplingParams
from tests.model.conftest import hf_greedy, hf_logits
from tests.model.families import FAMILIES, WINDOW, hf_model, save_folder, write_gguf
from tests.model.paging import PagedSequences

pytestmark = pytest.mark.hf
PROMPT_LEN = 5 * WINDOW + 3  # several windows past the first
NEW_TOKENS = 24


@pytest.fixture(scope="module", params=FAMILIES)
def family(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path
) -> dict[str, Any]:
    """The HF oracle of one family, its folder and GGUF, and the oracle of the GGUF: the same
    weights, with what llama.cpp's converter keeps of the config (Mistral's GGUF is written as
    Llama, without the window; Gemma's attention scale is 1 / sqrt(head_dim) in llama.cpp)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    name: str = request.param
    root = tmp_path_factory.mktemp(name)
    tokenizer_json = root / "tokenizer.json"
    load_model(tiny_gguf).tokenizer.backend.save(str(tokenizer_json))
    hf = hf_model(name)
    oracle_gguf = hf
    if name in ("mistral", "gemma3"):
        oracle_gguf = hf_model(name, window=None if name == "mistral" else WINDOW,
                               query_pre_attn_scalar=16)  # fmt: skip
        oracle_gguf.load_state_dict(hf.state_dict())
    return {
        "name": name,
        "hf": hf,
        "folder": save_folder(hf, root / "hf", tokenizer_json),
        "gguf": write_gguf(name, hf, root / f"{name}.gguf"),
        "oracle": {"folder": hf, "gguf": oracle_gguf},
        "root": root,
    }


def _prompt(seed: int, length: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, 272, length)]


def _chunked_logits(model: DecoderModel, ids: list[int], chunk: int) -> np.ndarray:
    """Every row's logits, the prompt fed as consecutive prefill chunks (pages of 4)."""
    state = PagedSequences(model, num_pages=len(ids) // 4 + 4, page_size=4)
    seq = state.new_sequence()
    parts = [state.all_logits(seq, ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return np.concatenate(parts)


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_logits_match_transformers_past_the_window(family: dict[str, Any], source: str) -> None:
    loaded = load_model(family[source])
    c = loaded.config
    assert c.architecture == ("llama" if source == "gguf" and family["name"] == "mistral"
                              else family["name"])  # fmt: skip
    if family["name"] in ("phi3", "gemma3") or (family["name"], source) == ("mistral", "folder"):
        assert c.layer_windows is not None and WINDOW in c.layer_windows
    model = DecoderModel.from_loaded(loaded)
    ids = _prompt(1, PROMPT_LEN)
    want = hf_logits(family["oracle"][source], ids)
    ours = _chunked_logits(model, ids, chunk=13)
    np.testing.assert_allclose(ours, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_greedy_tokens_batched_and_solo_equal_transformers(
    family: dict[str, Any], source: str
) -> None:
    oracle = family["oracle"][source]
    prompts = [_prompt(2, PROMPT_LEN), _prompt(3, 2 * WINDOW + 1)]
    want = [hf_greedy(oracle, p, NEW_TOKENS) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    # chunks of 8 prompt tokens: a 43-token prompt is 6 prefill steps, then decode steps
    kwargs = {"page_size": 4, "num_pages": 128, "max_num_batched_tokens": 8}
    with LLM(model=str(family[source]), **kwargs) as llm:
        batched = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        solo = [list(llm.generate([p], params)[0].outputs[0].token_ids) for p in prompts]
    assert batched == want
    assert solo == want


def test_fused_decode_equals_the_general_path(family: dict[str, Any]) -> None:
    """One-row decode steps (the fused compiled layer, with the family's optional parts) give
    bitwise the general path's logits."""
    loaded = load_model(family["gguf"])
    blocks = _as_q8_0(loaded)
    fused = DecoderModel(loaded.config, loaded.weights, blocks)
    plain = DecoderModel(loaded.config, loaded.weights, blocks, fused_decode=False)
    assert fused._fused is not None
    ids = _prompt(4, 2 * WINDOW + 5)
    outs = []
    for model in (fused, plain):
        state = PagedSequences(model, num_pages=32, page_size=4)
        seq = state.new_sequence()
        state.step({seq: ids[:3]})
        outs.append(np.stack([state.step({seq: [t]})[0] for t in ids[3:]]))
    np.testing.assert_array_equal(outs[0], outs[1])


def _as_q8_0(loaded: LoadedModel) -> dict[str, Any]:
    """Every projection of ``loaded`` as Q8_0 blocks (the fused layer reads blocks only)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from pagedattn.model.quantized import from_gguf_blocks

    arch = architecture(loaded.config.architecture)
    out = {}
    for i in range(loaded.config.num_layers):
        for role in ("q", "k", "v", "o", "gate", "up", "down"):
            name = arch.hf_name(role, i)
            w = np.asarray(loaded.weights[name], np.float32)
            raw = quantize(w, GGMLQuantizationType.Q8_0)
            out[name] = from_gguf_blocks(raw, "Q8_0", w.shape)
    return out


def test_the_wrong_qk_convention_fails(family: dict[str, Any]) -> None:
    """A GGUF whose q/k rows follow the other family's convention (permuted where llama.cpp
    does not permute, or not where it does) gives logits far from HF's, not a near miss."""
    name = family["name"]
    wrong = write_gguf(name, family["hf"], family["root"] / "wrong.gguf",
                       permute=name not in ("llama", "mistral"))  # fmt: skip
    model = DecoderModel.from_loaded(load_model(wrong))
    ids = _prompt(5, 2 * WINDOW)
    want = hf_logits(family["oracle"]["gguf"], ids)
    ours = _chunked_logits(model, ids, chunk=len(ids))
    assert np.abs(ours[1:] - want[1:]).max() > 1e-2


def test_fingerprint_covers_every_loaded_tensor(family: dict[str, Any]) -> None:
    """Changing any one tensor the table loads changes the weights fingerprint."""
    loaded = load_model(family["folder"])
    base = weights_fingerprint(DecoderModel.from_loaded(loaded))
    names = sorted(loaded.weights)
    assert len(names) == len(set(names))
    for name in names:
        weights = dict(loaded.weights)
        w = np.array(weights[name], dtype=np.float32)
        w.ravel()[0] += 1.0
        weights[name] = w
        assert weights_fingerprint(DecoderModel(loaded.config, weights)) != base, name


def test_torch_backend_greedy_equals_transformers(family: dict[str, Any]) -> None:
    """The torch backend reads the same table: HF's greedy tokens through chunked prefill."""
    prompt = _prompt(2, PROMPT_LEN)
    want = hf_greedy(family["oracle"]["folder"], prompt, NEW_TOKENS)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    kwargs = {"page_size": 4, "num_pages": 128, "max_num_batched_tokens": 8}
    with LLM(model=str(family["folder"]), backend="torch", **kwargs) as llm:
        assert list(llm.generate([prompt], params)[0].outputs[0].token_ids) == want
