"""A tiny random Llama saved as a Hugging Face folder (config.json, safetensors, tokenizer.json,
tokenizer_config.json with a chat template), built from the model tests' tiny GGUF pieces."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.numpy import save_file
from tokenizers import AddedToken

from pagedattn.model.tokenizer import Tokenizer
from tests.model.tiny import (
    CHAT_TEMPLATE,
    MERGES,
    SPECIALS,
    random_weights,
    tiny_config,
    tiny_tokens,
)


def write_tiny_folder(
    folder: Path,
    seed: int = 0,
    added_tokens: tuple[str, ...] = (),
    chat_template: str = "",
    context: int = 512,
) -> Path:
    """Write the tiny model (2 layers, hidden 64, vocab 272, context 512) to ``folder``.

    Args:
        added_tokens: more (non-special) vocabulary entries after the merges, e.g.
            ``<tool_call>``; the model's vocabulary grows with them.
        chat_template: the template instead of the ChatML one.
        context: ``max_position_embeddings``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(
        vocab_size=len(tiny_tokens()) + len(added_tokens), max_position_embeddings=context
    )
    raw = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (folder / "config.json").write_text(json.dumps(raw))
    save_file(random_weights(config, seed), str(folder / "model.safetensors"))
    tokens = tiny_tokens()
    tokenizer = Tokenizer.from_gguf_metadata(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "smollm",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": MERGES,
            "tokenizer.ggml.token_type": [3 if t in SPECIALS else 1 for t in tokens],
        }
    )
    if added_tokens:
        tokenizer.backend.add_tokens([AddedToken(t, special=False) for t in added_tokens])
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    tok_cfg = {
        "chat_template": chat_template or CHAT_TEMPLATE,
        "bos_token": SPECIALS[1],
        "eos_token": SPECIALS[2],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return folder
