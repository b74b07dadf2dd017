"""Tokenizer built with the ``tokenizers`` library, from a GGUF vocabulary or a ``tokenizer.json``.

A GGUF has no ``tokenizer.json``: it stores the vocabulary, merges, token types and a
pre-tokenizer name (llama.cpp ``tokenizer.ggml.*`` keys). For byte-level BPE ("gpt2" model) we
rebuild what transformers' GGUF integration builds
(``integrations/gguf/gguf_tokenizer_mapping.py``):
a BPE model over the byte alphabet of GPT-2 (Radford et al. 2019), a pre-tokenizer chosen by the
file's pre-tokenizer name, control tokens as special added tokens and user-defined tokens as
plain added tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from pagedattn.model.chat_template import render_chat_template

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Byte-level pre-tokenizers by llama.cpp pre-tokenizer name (``tokenizer.ggml.pre``).
_GPT2_PRE = ("default", "gpt2", "smollm")
_SPLIT_PRE = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT}


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


class Tokenizer:
    """Text <-> token ids, chat template rendering, and the stop tokens of a model.

    Args:
        backend: a ``tokenizers.Tokenizer``.
        chat_template: Jinja2 chat template text, or None.
        special_tokens: template variables (``bos_token``, ``eos_token``, ...) -> token text.
        eos_token_id: id that ends an assistant turn.
        stop_token_ids: every id that ends generation (eos included).
    """

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        chat_template: str | None,
        special_tokens: Mapping[str, str | None],
        eos_token_id: int | None,
        stop_token_ids: Sequence[int] = (),
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens)
        self.eos_token_id = eos_token_id
        stops = {int(t) for t in stop_token_ids}
        if eos_token_id is not None:
            stops.add(eos_token_id)
        self.stop_token_ids: frozenset[int] = frozenset(stops)
        bos = self.special_tokens.get("bos_token")
        self.bos_token_id: int | None = None if bos is None else backend.token_to_id(bos)

    @property
    def vocab_size(self) -> int:
        """Number of token ids (added tokens included)."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token text (e.g. ``<|im_end|>``) maps to its single id.

        ``add_special_tokens`` applies the tokenizer's post-processor (BOS/EOS if it adds any).
        """
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 byte sequences decode to U+FFFD.

        Raises:
            ValueError: an id outside ``[0, vocab_size)``.
        """
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {bad[:5]}")
        return str(self.backend.decode(ids, skip_special_tokens=skip_special_tokens))

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of one id (byte-level spelling), or None if unknown."""
        token = self.backend.id_to_token(int(token_id))
        return None if token is None else str(token)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Render a conversation to prompt text, as HF ``apply_chat_template(tokenize=False)``.

        Args:
            messages: the conversation (dicts with ``role`` and ``content``).
            add_generation_prompt, continue_final_message: see
                :func:`pagedattn.model.chat_template.render_chat_template`.
            chat_template: a template to use instead of the model's.
            **kwargs: extra template variables (HF ``chat_template_kwargs``, e.g. ``tools``).

        Raises:
            ValueError: no chat template (the model has none and none is given), or rendering
                failed.
        """
        source = chat_template if chat_template is not None else self.chat_template
        if not source:
            raise ValueError("this tokenizer has no chat template")
        return render_chat_template(
            source,
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            special_tokens=self.special_tokens,
            **kwargs,
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Token ids of the rendered conversation (the template writes its own special tokens);
        ``kwargs`` as :meth:`apply_chat_template`."""
        text = self.apply_chat_template(messages, add_generation_prompt, **kwargs)
        return self.encode(text, add_special_tokens=False)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF ``tokenizer.ggml.*`` / ``tokenizer.chat_template`` metadata values.

        Raises:
            ValueError: a tokenizer model other than byte-level BPE ("gpt2"), an unknown
                pre-tokenizer, or missing vocabulary/merges.
        """
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' only); "
                "use a Hugging Face folder with tokenizer.json instead"
            )
        tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or ())
        merges: list[str] = list(meta.get("tokenizer.ggml.merges") or ())
        if not tokens or not merges:
            raise ValueError(
                "GGUF tokenizer: missing tokenizer.ggml.tokens or tokenizer.ggml.merges"
            )
        types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        alphabet = set(bytes_to_unicode().values())
        spelling = bytes_to_unicode()
        vocab = {
            tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
            for i, tok in enumerate(tokens)
        }
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        backend = BackendTokenizer(
            models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)  # type: ignore[arg-type]
        )
        backend.pre_tokenizer = _byte_level_pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "")))
        backend.decoder = decoders.ByteLevel()
        control = [
            t for t, ty in zip(tokens, types, strict=True) if ty == _CONTROL and set(t) <= alphabet
        ]
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
        user = [t for t, ty in zip(tokens, types, strict=True) if ty == _USER_DEFINED]
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

        def tok(key: str) -> str | None:
            idx = meta.get(f"tokenizer.ggml.{key}")
            return tokens[int(idx)] if idx is not None and 0 <= int(idx) < len(tokens) else None

        eos = meta.get("tokenizer.ggml.eos_token_id")
        eot = meta.get("tokenizer.ggml.eot_token_id")  # end-of-turn, when distinct from eos
        return cls(
            backend,
            chat_template=meta.get("tokenizer.chat_template"),
            special_tokens={
                "bos_token": tok("bos_token_id"),
                "eos_token": tok("eos_token_id"),
                "unk_token": tok("unknown_token_id"),
                "pad_token": tok("padding_token_id"),
            },
            eos_token_id=None if eos is None else int(eos),
            stop_token_ids=[int(eot)] if eot is not None else [],
        )

    @classmethod
    def from_folder(cls, folder: Path, extra_stop_ids: Sequence[int] = ()) -> Tokenizer:
        """Build from a Hugging Face folder: ``tokenizer.json`` + ``tokenizer_config.json``
        (``chat_template``, ``bos_token``, ``eos_token``), or ``chat_template.jinja``.

        Raises:
            ValueError: no ``tokenizer.json`` in the folder.
        """
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"{folder}: no tokenizer.json")
        backend = BackendTokenizer.from_file(str(path))
        cfg_path = folder / "tokenizer_config.json"
        cfg: dict[str, Any] = (
            json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
        )
        template = cfg.get("chat_template")
        jinja_path = folder / "chat_template.jinja"
        if template is None and jinja_path.is_file():
            template = jinja_path.read_text(encoding="utf-8")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)

        def tok(key: str) -> str | None:
            value = cfg.get(key)
            return value.get("content") if isinstance(value, dict) else value

        special = {k: tok(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        eos = special["eos_token"]
        eos_id = None if eos is None else backend.token_to_id(eos)
        return cls(
            backend,
            chat_template=template,
            special_tokens=special,
            eos_token_id=eos_id,
            stop_token_ids=extra_stop_ids,
        )
