"""The real Qwen2.5-Coder-0.5B-Instruct and Gemma 3 270M GGUFs against transformers loading the
same files (``from_pretrained(dir, gguf_file=...)``, dequantized to float32).

Greedy tokens must be equal for 48 tokens, on a chat prompt (Qwen) and on a raw prompt of more
than 800 tokens (Gemma: past its 512-token window on five of every six layers), and the first
generated token's log-probabilities within 1e-3. Token ids come from HF's tokenizer loaded from
the same GGUF and are fed to our model directly, so this checks the forward alone.

The files are looked up where ``pagedattn pull`` installs them (``models_dir()``) under their
published names; the tests skip when a file is absent.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.model.catalogue import models_dir
from pagedattn.model.decoder import DecoderModel
from pagedattn.model.gguf_loader import gguf_config, gguf_weights, open_gguf
from tests.model.conftest import hf_greedy, hf_logits
from tests.model.paging import PagedSequences

pytestmark = [pytest.mark.model, pytest.mark.hf]
FILES = {
    "qwen2": (
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "gemma3": (
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}
NEW_TOKENS = 48
TEXT = Path(__file__).parents[2] / "src" / "pagedattn" / "data" / "prideprejudice.txt"


def _file(family: str) -> Path:
    name, sha = FILES[family]
    path = models_dir() / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (pagedattn pull installs it)")
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    assert digest.hexdigest() == sha, f"{path}: not the published file"
    return path


def _prompt(family: str, tokenizer: Any) -> list[int]:
    if family == "qwen2":
        messages = [{"role": "user", "content": "Write a Python function that tells whether "
                     "a number is prime, with a docstring."}]  # fmt: skip
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert 30 < len(ids) < 100
        return [int(i) for i in ids]
    ids = tokenizer(TEXT.read_text(encoding="utf-8")[:8000])["input_ids"][:850]
    assert len(ids) == 850 and ids[0] == tokenizer.bos_token_id
    return [int(i) for i in ids]


@pytest.mark.parametrize("family", sorted(FILES))
def test_greedy_tokens_and_logprobs_equal_transformers_on_the_same_gguf(family: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = _file(family)
    reader = open_gguf(path)
    config = gguf_config(reader, path)
    assert config.architecture == family
    if family == "gemma3":
        assert config.layer_windows == tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(18))
    weights, quantized = gguf_weights(reader, config)
    model = DecoderModel(config, weights, quantized)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    prompt = _prompt(family, tokenizer)

    state = PagedSequences(model, num_pages=(len(prompt) + NEW_TOKENS) // 16 + 2, page_size=16)
    seq = state.new_sequence()
    logits = [state.step({seq: prompt})[0]]
    ours = [int(np.argmax(logits[0]))]
    while len(ours) < NEW_TOKENS:
        ours.append(int(np.argmax(state.step({seq: [ours[-1]]})[0])))

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    want = hf_greedy(hf, prompt, NEW_TOKENS)
    assert ours == want, (tokenizer.decode(ours), tokenizer.decode(want))
    first = hf_logits(hf, prompt)[-1]

    def logprobs(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        return x - x.max() - np.log(np.exp(x - x.max()).sum())

    np.testing.assert_allclose(logprobs(logits[0]), logprobs(first), rtol=0, atol=1e-3)
