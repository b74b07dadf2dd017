"""A tiny SentencePiece (Llama-2 / Mistral / TinyLlama style) vocabulary written into a GGUF.

No SentencePiece GGUF can be downloaded here, so we make one: train a small BPE model with the
``sentencepiece`` package (``byte_fallback=True``, identity normalization, whitespace kept, as
Llama's tokenizer.model is) on a Jane Austen novel from ``../shared/data/corpora``, then write its
pieces, scores and token types the way llama.cpp's ``convert_hf_to_gguf.py``
(``_create_vocab_sentencepiece`` / ``_set_vocab_sentencepiece``) does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from pagedattn.config import ModelConfig
from tests.model.tiny import random_weights, tiny_config, write_tensors

SPM_VOCAB_SIZE = 1000
SPIECE = "\u2581"
USER_DEFINED = ["<|im_start|>", "<|im_end|>"]
# llama.cpp SentencePieceTokenTypes
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def corpus_file(name: str = "persuasion.txt") -> Path:
    """A novel from ``../shared/data/corpora`` (next to the repository); skips when absent."""
    repo = Path(__file__).resolve().parents[2]
    for folder in (Path.cwd() / "../shared/data/corpora", repo / "../shared/data/corpora"):
        if (folder / name).is_file():
            return (folder / name).resolve()
    pytest.skip(f"corpus {name} not found in ../shared/data/corpora")


def train_spm(folder: Path, vocab_size: int = SPM_VOCAB_SIZE) -> Path:
    """Train a byte-fallback BPE SentencePiece model (ids 0-2: <unk> <s> </s>); returns the
    ``.model`` path. Deterministic (one thread)."""
    spm = pytest.importorskip("sentencepiece")
    folder.mkdir(parents=True, exist_ok=True)
    prefix = folder / "spm"
    spm.SentencePieceTrainer.train(
        input=str(corpus_file()),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        user_defined_symbols=USER_DEFINED,
        num_threads=1,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def spm_vocab(model_file: Path) -> tuple[list[str], list[float], list[int]]:
    """(pieces, scores, llama.cpp token types) as ``_create_vocab_sentencepiece`` reads them."""
    import sentencepiece as spm

    proc = spm.SentencePieceProcessor(model_file=str(model_file))
    tokens, scores, types = [], [], []
    for i in range(proc.vocab_size()):
        kind = _NORMAL
        if proc.IsUnknown(i):
            kind = _UNKNOWN
        elif proc.IsControl(i):
            kind = _CONTROL
        elif proc.IsUnused(i):
            kind = _UNUSED
        elif proc.IsByte(i):
            kind = _BYTE
        elif proc.IdToPiece(i) in USER_DEFINED:
            kind = _USER_DEFINED
        tokens.append(proc.IdToPiece(i))
        scores.append(float(proc.GetScore(i)))
        types.append(kind)
    return tokens, scores, types


def spm_config(**overrides: object) -> ModelConfig:
    """:func:`tiny_config`'s shapes with the SentencePiece vocabulary (bos 1, eos 2)."""
    fields: dict[str, object] = {"vocab_size": SPM_VOCAB_SIZE, "bos_token_id": 1}
    return tiny_config(**{**fields, "eos_token_id": 2, **overrides})


def write_spm_gguf(
    path: Path,
    model_file: Path,
    *,
    config: ModelConfig | None = None,
    add_bos_token: bool | None = True,
    add_eos_token: bool | None = False,
    add_space_prefix: bool | None = None,
    seed: int = 0,
) -> Path:
    """A tiny random Llama GGUF with the SentencePiece vocabulary (``tokenizer.ggml.model`` =
    "llama", pre "default"); None leaves a flag out of the file, as older converters did."""
    config = spm_config() if config is None else config
    tokens, scores, types = spm_vocab(model_file)
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    if add_bos_token is not None:
        writer.add_add_bos_token(add_bos_token)
    if add_eos_token is not None:
        writer.add_add_eos_token(add_eos_token)
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    weights: dict[str, np.ndarray] = random_weights(config, seed)
    write_tensors(writer, config, weights)
    return path


def write_spm_folder(folder: Path, gguf: Path, style: str, seed: int = 0) -> Path:
    """The same tiny model as a Hugging Face folder: ``config.json``, safetensors of the same
    random weights (seed), and a ``tokenizer.json`` of one of three styles:

    - ``"transformers"``: what transformers builds from the GGUF and saves (Metaspace
      pre-tokenizer; Replace/ByteFallback/Fuse/Strip decoder) - the independent one;
    - ``"legacy"``: Llama-2 / TinyLlama / Mistral-v0.1 ``tokenizer.json`` (Prepend + Replace
      normalizer, no pre-tokenizer, same decoder);
    - ``"metaspace"``: a Metaspace decoder after ByteFallback (``SentencePieceBPETokenizer``).
    """
    import json

    from safetensors.numpy import save_file
    from tokenizers import decoders, normalizers

    from pagedattn.model.loader import load_model

    folder.mkdir(parents=True, exist_ok=True)
    if style == "transformers":
        transformers = pytest.importorskip("transformers")
        hf = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        hf.save_pretrained(str(folder))
    else:
        backend = load_model(gguf).tokenizer.backend
        if style == "legacy":
            backend.normalizer = normalizers.Sequence(
                [normalizers.Prepend(SPIECE), normalizers.Replace(" ", SPIECE)]
            )
            backend.pre_tokenizer = None  # type: ignore[assignment]
        elif style == "metaspace":
            backend.decoder = decoders.Sequence(
                [decoders.ByteFallback(), decoders.Metaspace(SPIECE, prepend_scheme="first")]
            )
        else:
            raise ValueError(f"style {style!r}")
        backend.save(str(folder / "tokenizer.json"))
        config_json = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
        (folder / "tokenizer_config.json").write_text(json.dumps(config_json))
    c = spm_config()
    raw = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (folder / "config.json").write_text(json.dumps(raw))
    save_file(random_weights(c, seed), str(folder / "model.safetensors"))
    return folder
