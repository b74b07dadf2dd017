"""TorchLlamaModel's own contract: its refusals, and the reduced-precision option."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.backends import BackendSpec
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.sampling_params import SamplingParams
from tests.backends.helpers import Recorder, run, tiny_on
from tests.model.tiny import random_weights, tiny_config

torch = pytest.importorskip("torch")
from pagedattn.model.torch_model import TorchLlamaModel  # noqa: E402

NUMPY = BackendSpec("numpy", "cpu")


def _decode_batch(token: int = 5) -> ForwardBatch:
    return ForwardBatch(
        input_ids=np.array([token], np.int64),
        positions=np.array([0], np.int64),
        slot_mapping=np.array([0], np.int64),
        query_start_loc=np.array([0, 1], np.int32),
        context_lens=np.array([1], np.int32),
        page_tables=np.array([[0]], np.int32),
        logits_indices=np.array([0], np.int64),
    )


def test_refusals_name_the_field() -> None:
    model = TorchLlamaModel(tiny_config(), random_weights(tiny_config()))
    kv = torch.zeros(model.kv_shape(2, 4))
    with pytest.raises(ValueError, match="attention_mass: the torch backend"):
        model.forward(_decode_batch(), kv, attention_mass=np.zeros((1, 1), np.float32))
    with pytest.raises(ValueError, match="kv: expected a contiguous float32 torch tensor"):
        model.forward(_decode_batch(), np.zeros(model.kv_shape(2, 4), np.float32))
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, "):
        model.forward(_decode_batch(token=10**6), kv)
    with pytest.raises(ValueError, match="dtype: expected one of"):
        TorchLlamaModel(tiny_config(), random_weights(tiny_config()), dtype="float64")
    weights = random_weights(tiny_config())
    del weights["model.norm.weight"]
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        TorchLlamaModel(tiny_config(), weights)


def test_bfloat16_runs_the_engine_close_to_float32() -> None:
    """bfloat16 (about 3 significant digits) is an opt-in speed option, not exact: its
    logits stay within a bfloat16-sized bound of the float32 NumPy backend's."""
    config = tiny_config()
    bf16 = Recorder(TorchLlamaModel(config, random_weights(config), dtype="bfloat16"))
    ref = Recorder(tiny_on(NUMPY))
    prompt = np.random.default_rng(1).integers(3, config.vocab_size, 11).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    spec = BackendSpec("torch", "cpu")
    run(spec, bf16, [("b", prompt, params)], page_size=4, num_pages=16)
    run(NUMPY, ref, [("b", prompt, params)], page_size=4, num_pages=16)
    first, want = bf16.logits[0], ref.logits[0]  # the prompt's logits (same input ids)
    assert first.dtype == np.float32 and np.isfinite(first).all()
    scale = float(np.abs(want).max())
    assert float(np.abs(first - want).max()) <= 0.05 * scale
