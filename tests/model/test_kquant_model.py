"""A GGUF mixing K-quant and Q5 tensors (as llama.cpp's Q4_K_M / Q5_K_M files do) runs from its
blocks: no float32 copy, and the greedy tokens of the same model stored in float32."""

from __future__ import annotations

import itertools
import mmap
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from pagedattn.engine.llm import LLM
from pagedattn.model.loader import load_model
from pagedattn.model.quantized import BlockQuantized
from pagedattn.model.weights import expected_weight_shapes
from pagedattn.sampling_params import SamplingParams
from tests.model.random_blocks import random_blocks
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

CONFIG = tiny_config(hidden_size=256, intermediate_size=512, head_dim=64, tie_word_embeddings=False)
# float16 field sizes giving weights of about 1 / sqrt(256) for each type's codes
SCALES = {Q.Q4_K: 2e-4, Q.Q5_K: 1e-4, Q.Q6_K: 5e-5, Q.Q5_0: 4e-3, Q.Q5_1: 4e-3}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Q]]:
    """The K-quant file, the same weights as gguf dequantizes them in float32, and each
    matrix's type (HF names)."""
    rng = np.random.default_rng(0)
    weights = random_weights(CONFIG)  # the norms (float32); every matrix is replaced
    types = itertools.cycle((Q.Q4_K, Q.Q6_K, Q.Q5_K, Q.Q5_0, Q.Q5_1))
    blocks: dict[str, tuple[np.ndarray, Q]] = {}
    floats: dict[str, tuple[np.ndarray, Q]] = {}
    kinds: dict[str, Q] = {}
    for name, shape in expected_weight_shapes(CONFIG).items():
        if len(shape) != 2:
            continue
        qtype = Q.Q6_K if name == "model.embed_tokens.weight" else next(types)
        raw = random_blocks(qtype, (shape[0], shape[1]), rng, SCALES[qtype], centred=True)
        blocks[name] = (raw, qtype)
        floats[name] = (dequantize(raw, qtype).reshape(shape), Q.F32)
        kinds[name] = qtype
    folder = tmp_path_factory.mktemp("kquant")
    quantized = write_tiny_gguf(folder / "k.gguf", CONFIG, weights, stored=blocks)
    dense = write_tiny_gguf(folder / "f32.gguf", CONFIG, weights, stored=floats)
    return quantized, dense, kinds


def _memory_mapped(a: np.ndarray) -> bool:
    """Whether ``a`` views a memory map (not memory of its own or a copy's)."""
    base: object = a
    while isinstance(base, np.ndarray) and not isinstance(base, np.memmap):
        base = base.base
    return isinstance(base, (np.memmap, mmap.mmap, memoryview))


def test_kquant_file_loads_as_blocks(files: tuple[Path, Path, dict[str, Q]]) -> None:
    path, _, kinds = files
    loaded = load_model(path)
    assert set(loaded.quantized) == set(kinds)
    for name, qtype in kinds.items():
        block = loaded.quantized[name]
        held_as = {Q.Q5_K: "Q5_1"}.get(qtype, qtype.name)
        assert isinstance(block, BlockQuantized) and block.type_name == held_as, name
        rows, cols = expected_weight_shapes(CONFIG)[name]
        # the kernels' layout: the file's bytes for Q6_K; float32 scales (and Q5_1's minimum)
        # for the 32-input formats, 2 bytes more per float16 field; Q4_K with float32 d and
        # dmin (4 bytes more per 256 inputs); Q5_K as Q5_1 blocks of float32 fields, one per
        # 32-input sub-block
        elements, size = {Q.Q4_K: (256, 152), Q.Q5_K: (32, 28), Q.Q6_K: (256, 210),
                          Q.Q5_0: (32, 22 + 2), Q.Q5_1: (32, 24 + 4)}[qtype]  # fmt: skip
        assert (
            block.blocks.dtype == np.uint8 and block.blocks.nbytes == rows * cols // elements * size
        )
        # the file's own bytes where nothing moves: Q6_K rows in their order, in a count that
        # is not a multiple of four (rows in groups of four are interleaved: a copy)
        reordered = name.endswith(("q_proj.weight", "k_proj.weight"))  # q/k rows: a copy
        kept = qtype == Q.Q6_K and not reordered and rows % 4 != 0
        assert _memory_mapped(block.blocks) == kept, name


def test_kquant_greedy_tokens_equal_float32_model(files: tuple[Path, Path, dict[str, Q]]) -> None:
    quantized, dense, _ = files
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    prompts = [[5, 9, 14, 20, 3, 7, 11], [40, 41, 42], list(range(60, 90))]
    outs = []
    for path in (quantized, dense):
        llm = LLM(str(path), page_size=4, num_pages=64)
        outs.append([o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)])
    assert len({tuple(o.token_ids) for o in outs[0]}) > 1  # not a degenerate model
    for a, b in zip(*outs, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs is not None and b.logprobs is not None
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):  # 1e-3: fp32 paths
            for t in la.keys() & lb.keys():
                assert abs(la[t].logprob - lb[t].logprob) < 1e-3
