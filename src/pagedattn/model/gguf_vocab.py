"""Build a ``tokenizers`` pipeline from a GGUF vocabulary (llama.cpp ``tokenizer.ggml.*`` keys).

A GGUF has no ``tokenizer.json``: it stores the tokens, merges or scores, token types, special
token ids and flags. We rebuild what transformers' GGUF integration builds
(``integrations/gguf/gguf_tokenizer_mapping.py``), the oracle our tests compare against:

- ``"gpt2"``: byte-level BPE over GPT-2's byte alphabet (Radford et al. 2019), pre-tokenizer
  chosen by ``tokenizer.ggml.pre``;
- ``"llama"``: SentencePiece (Kudo & Richardson 2018) vocabularies with byte fallback, built by
  :mod:`.spm_vocab` per architecture (Llama-2 / Mistral, Gemma, Phi-3).

Control tokens become special added tokens and user-defined tokens plain added tokens; BOS/EOS
are added by a post-processor when ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say so
(a SentencePiece file without the flag adds BOS, as llama.cpp and transformers do).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import accumulate, repeat
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from pagedattn.model.spm_vocab import sentencepiece_backend

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's split (transformers ``models/qwen2/tokenization_qwen2.py``): single digits, and the
# llama-3 rules otherwise; llama.cpp's "qwen2" pre-tokenizer type.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Byte-level pre-tokenizers by llama.cpp pre-tokenizer name (``tokenizer.ggml.pre``).
_GPT2_PRE = ("default", "gpt2", "smollm")
_SPLIT_PRE = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
SUPPORTED_MODELS = ("gpt2", "llama")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (openai/gpt-2 ``encoder.py``)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre in _GPT2_PRE:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _SPLIT_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PRE[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise ValueError(
        f"unsupported GGUF pre-tokenizer {pre!r}; supported: {sorted((*_GPT2_PRE, *_SPLIT_PRE))}"
    )


def byte_level_spelling(tokens: Sequence[str]) -> list[str]:
    """``tokens`` with each one that has a character outside GPT-2's byte alphabet re-spelled as
    the alphabet characters of its UTF-8 bytes (the others, usually all, unchanged).

    One regex pass over the joined vocabulary finds the few tokens to re-spell, instead of a
    per-token set test (49k tokens: milliseconds instead of ~0.1 s).
    """
    spelling = bytes_to_unicode()
    outside = re.compile("[^" + re.escape("".join(sorted(spelling.values()))) + "]")
    ends = list(accumulate(map(len, tokens)))
    out = list(tokens)
    for i in sorted({bisect_right(ends, m.start()) for m in outside.finditer("".join(tokens))}):
        out[i] = "".join(spelling[b] for b in tokens[i].encode("utf-8"))
    return out


def split_merges(merges: Sequence[str]) -> list[tuple[str, ...]]:
    """``"left right"`` merge strings -> ``(left, right)`` pairs, split at the first space.

    When every merge holds exactly one space and no newline (always, for a byte-level
    vocabulary, whose tokens spell them "Ġ" and "Ċ") one join / split does all of them at C
    speed; otherwise each is split on its own.
    """
    n = len(merges)
    joined = "\n".join(merges)
    if (
        joined.count("\n") == n - 1
        and joined.count(" ") == n
        and all(map(str.__contains__, merges, repeat(" ")))
    ):
        parts = joined.replace("\n", " ").split(" ")
        return list(zip(parts[0::2], parts[1::2], strict=True))
    return [tuple(m.split(" ", 1)) for m in merges]


def _byte_level_backend(meta: Mapping[str, Any], tokens: list[str]) -> BackendTokenizer:
    merges: list[str] = list(meta.get("tokenizer.ggml.merges") or ())
    if not merges:
        raise ValueError("GGUF tokenizer: missing tokenizer.ggml.merges")
    vocab = dict(zip(byte_level_spelling(tokens), range(len(tokens)), strict=True))
    backend = BackendTokenizer(
        models.BPE(vocab=vocab, merges=split_merges(merges), fuse_unk=False, byte_fallback=False)  # type: ignore[arg-type]
    )
    backend.pre_tokenizer = _byte_level_pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "")))
    backend.decoder = decoders.ByteLevel()
    return backend


def special_token(meta: Mapping[str, Any], tokens: Sequence[str], key: str) -> str | None:
    """The text of the token whose id ``tokenizer.ggml.<key>`` names, or None."""
    idx = meta.get(f"tokenizer.ggml.{key}")
    return tokens[int(idx)] if idx is not None and 0 <= int(idx) < len(tokens) else None


def gguf_backend(meta: Mapping[str, Any]) -> BackendTokenizer:
    """The ``tokenizers.Tokenizer`` a GGUF's ``tokenizer.*`` metadata describes.

    Raises:
        ValueError: a tokenizer model other than "gpt2" / "llama", an unknown byte-level
            pre-tokenizer, a missing vocabulary, merges or scores.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind not in SUPPORTED_MODELS:
        raise ValueError(
            f"GGUF tokenizer model {kind!r} is not supported (supported: {list(SUPPORTED_MODELS)}:"
            " byte-level BPE and SentencePiece); use a Hugging Face folder with tokenizer.json"
        )
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or ())
    if not tokens:
        raise ValueError("GGUF tokenizer: missing tokenizer.ggml.tokens")
    raw_types = meta.get("tokenizer.ggml.token_type")
    types = np.ones(len(tokens), np.int64) if raw_types is None else np.asarray(raw_types)
    if types.shape != (len(tokens),):
        raise ValueError(f"GGUF tokenizer: {len(types)} token types for {len(tokens)} tokens")
    if kind == "gpt2":
        backend = _byte_level_backend(meta, tokens)
        alphabet = set(bytes_to_unicode().values())
        # a control token outside the byte alphabet is a llama.cpp mislabel (as transformers)
        control = [tokens[i] for i in np.flatnonzero(types == CONTROL)]
        special = [t for t in control if set(t) <= alphabet]
    else:
        backend = sentencepiece_backend(meta, tokens, str(meta.get("general.architecture", "")))
        named = ("unknown_token_id", "bos_token_id", "eos_token_id", "padding_token_id")
        special = [t for t in (special_token(meta, tokens, k) for k in named) if t is not None]
        special += [tokens[i] for i in np.flatnonzero(types == CONTROL)]
    backend.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t in dict.fromkeys(special)]
    )
    # a user-defined token the model's vocabulary spells otherwise (Gemma's whitespace runs,
    # re-spelled as "▁▁") is not an added token (as transformers)
    # (asked per token: the whole vocabulary as a dict costs ~20 ms on 49k tokens)
    user = [
        tokens[i]
        for i in np.flatnonzero(types == USER_DEFINED)
        if backend.token_to_id(tokens[i]) is not None
    ]
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    _set_post_processor(backend, meta, tokens, default_add_bos=kind == "llama")
    return backend


def _set_post_processor(
    backend: BackendTokenizer, meta: Mapping[str, Any], tokens: list[str], default_add_bos: bool
) -> None:
    """BOS/EOS per the GGUF's ``add_bos_token`` / ``add_eos_token`` (none when neither)."""
    bos = special_token(meta, tokens, "bos_token_id")
    eos = special_token(meta, tokens, "eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", default_add_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    if add_bos or add_eos:
        set_bos_eos_template(backend, bos if add_bos else None, eos if add_eos else None)


def set_bos_eos_template(backend: BackendTokenizer, bos: str | None, eos: str | None) -> None:
    """Make ``backend`` put ``bos`` before and ``eos`` after every encoded text (None: not
    that one), as transformers' ``update_post_processor`` template does."""
    single = f"{f'{bos}:0 ' if bos else ''}$A:0{f' {eos}:0' if eos else ''}"
    pair = f"{single}{f' {bos}:1' if bos else ''} $B:1{f' {eos}:1' if eos else ''}"
    special = [(t, backend.token_to_id(t)) for t in (bos, eos) if t is not None]
    backend.post_processor = processors.TemplateProcessing(
        single=single,
        pair=pair,
        special_tokens=special,  # type: ignore[arg-type]
    )
