"""SentencePiece GGUF vocabularies (``tokenizer.ggml.model == "llama"``) as ``tokenizers`` BPE.

SentencePiece (Kudo & Richardson 2018) BPE with byte fallback (``<0x0A>`` tokens) over
"▁"-marked words, with the merges the file gives or, as usual, recovered from the vocabulary
(transformers' ``generate_merges``). The text around the model differs per family; we build what
transformers' GGUF integration builds for each (``integrations/gguf/gguf_tokenizer_mapping.py``),
the oracle our tests compare against:

- Llama-2, Mistral, TinyLlama (any architecture not named below): a Metaspace pre-tokenizer that
  marks the first word (unless ``add_space_prefix`` is false), merges ranked by score;
- Gemma (``gemma``, ``gemma2``, ``gemma3``): no pre-tokenizer split, every space becomes "▁" by a
  normalizer and no word-start mark is added; tokens made only of spaces are stored as spaces and
  re-spelled "▁▁..."; merges ranked by position in the file (Gemma's scores do not follow merge
  order);
- Phi-3: the word-start mark comes from a normalizer (prepend "▁", spaces to "▁"), no
  pre-tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

SPIECE_UNDERLINE = "\u2581"  # "▁", SentencePiece's word-start mark
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")


def merges_from_scores(
    vocab: Mapping[str, int], scores: Mapping[str, float]
) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a piece into two
    pieces of the vocabulary, best score first (ties: shorter left, then shorter right piece).

    The same algorithm as transformers' ``tokenization_utils_base.generate_merges`` (used by its
    SentencePiece converters), so that our token ids equal transformers'.
    """
    merges: list[tuple[str, str, float]] = []
    for piece, score in scores.items():
        local = [
            (piece[:i], piece[i:], score)
            for i in range(1, len(piece))
            if piece[:i] in vocab and piece[i:] in vocab
        ]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def metadata_values(meta: Mapping[str, Any], key: str) -> list[Any]:
    """A metadata array (list or numpy array, as :mod:`.gguf_header` gives numeric arrays) as
    a list of Python values; empty when absent."""
    value = meta.get(key)
    if value is None:
        return []
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _merges(
    meta: Mapping[str, Any], vocab: Mapping[str, int], ranks: Mapping[str, float] | None
) -> list[tuple[str, str]]:
    """The file's merges, else those its vocabulary implies ranked by ``ranks`` (None: the
    pieces' scores)."""
    given: list[str] = list(meta.get("tokenizer.ggml.merges") or ())
    if given:
        return [(m.split(" ")[0], m.split(" ")[1]) for m in given]
    if ranks is None:
        scores = metadata_values(meta, "tokenizer.ggml.scores")
        if len(scores) != len(vocab):
            raise ValueError(
                f"GGUF tokenizer: tokenizer.ggml.scores has {len(scores)} entries for "
                f"{len(vocab)} tokens (and there are no tokenizer.ggml.merges)"
            )
        ranks = dict(zip(vocab, map(float, scores), strict=True))
    return merges_from_scores(vocab, ranks)


def sentencepiece_backend(
    meta: Mapping[str, Any], tokens: list[str], architecture: str
) -> BackendTokenizer:
    """The ``tokenizers`` pipeline of a SentencePiece GGUF vocabulary for ``architecture``
    (``general.architecture``; see the module docstring for what differs per family).

    Raises:
        ValueError: neither merges nor one score per token in the file.
    """
    gemma = architecture in GEMMA_ARCHITECTURES
    if gemma:  # whitespace-only pieces are stored as spaces; the merges spell them "▁"
        tokens = [SPIECE_UNDERLINE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    ranks = {t: -float(i) for i, t in enumerate(tokens)} if gemma else None
    merges = _merges(meta, vocab, ranks)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None and 0 <= int(unk_id) < len(tokens) else None
    backend = BackendTokenizer(
        models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, unk_token=unk)
    )
    steps = [decoders.Replace(SPIECE_UNDERLINE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        backend.normalizer = normalizers.Replace(" ", SPIECE_UNDERLINE)
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        backend.decoder = decoders.Sequence(steps)
        return backend
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    if architecture == "phi3":
        backend.normalizer = normalizers.Sequence(
            [
                normalizers.Prepend(SPIECE_UNDERLINE),
                normalizers.Replace(" ", SPIECE_UNDERLINE),
            ]
        )
        backend.pre_tokenizer = None
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPIECE_UNDERLINE,
            prepend_scheme="first" if prefix else "never",
            split=False,
        )
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend
