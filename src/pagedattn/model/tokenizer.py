"""Tokenizer built with the ``tokenizers`` library, from a GGUF vocabulary or a ``tokenizer.json``.

GGUF vocabularies (byte-level BPE and SentencePiece) are rebuilt by :mod:`.gguf_vocab`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from pagedattn.model.chat_template import render_chat_template
from pagedattn.model.gguf_vocab import bytes_to_unicode, gguf_backend, special_token

__all__ = ["END_OF_TURN_TOKENS", "NO_CHAT_TEMPLATE", "Tokenizer", "bytes_to_unicode"]

NO_CHAT_TEMPLATE = "this model has no chat template: it is a base model that completes raw text"

# Special tokens that end a turn or a text in the chat formats of the common families (ChatML,
# Gemma, Phi-3, Llama 3 / 3.1 tool messages, GPT-2 style end of text); llama.cpp treats the same
# texts as end of generation when the vocabulary marks them special.
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<end_of_turn>",
    "<|end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
)


def _added_by_post_processor(backend: BackendTokenizer) -> tuple[list[int], list[int]]:
    """(prefix ids, suffix ids) the post-processor puts around every encoded text."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return list(full[:i]), list(full[i + len(plain) :])
    return [], []


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
        #: number of token ids, added tokens included (read once: ``tokenizers`` counts them
        #: anew on each call, milliseconds with a 262k vocabulary)
        self.vocab_size = int(backend.get_vocab_size(with_added_tokens=True))
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens)
        self.eos_token_id = eos_token_id
        stops = {int(t) for t in stop_token_ids}
        if eos_token_id is not None:
            stops.add(eos_token_id)
        self.stop_token_ids: frozenset[int] = frozenset(stops)
        bos = self.special_tokens.get("bos_token")
        self.bos_token_id: int | None = None if bos is None else backend.token_to_id(bos)
        self._added_prefix, self._added_suffix = _added_by_post_processor(backend)
        if chat_template:
            self._check_chat_template()

    def _check_chat_template(self) -> None:
        """Render a one-message conversation, so that a template which cannot render fails
        when the model loads, not on the first request.

        Raises:
            ValueError: the template is not valid Jinja2 or fails to render (its message kept).
        """
        try:
            self.apply_chat_template([{"role": "user", "content": "Hello"}])
        except ValueError as exc:
            raise ValueError(
                f"the model's chat template (tokenizer.chat_template) fails to render a "
                f"one-message conversation: {exc}"
            ) from exc

    @property
    def adds_bos(self) -> bool:
        """Whether ``encode(text)`` puts BOS first (GGUF ``add_bos_token``, or the
        ``tokenizer.json`` post-processor)."""
        return self.bos_token_id is not None and self._added_prefix == [self.bos_token_id]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token text (e.g. ``<|im_end|>``) maps to its single id.

        ``add_special_tokens`` applies the tokenizer's post-processor (BOS/EOS if it adds any),
        except that a text which already starts with the tokens it would add (``"<s>Hi"``)
        or already ends with those it would append gets no second copy (HF transformers and
        llama.cpp would give ``[<s>, <s>, ...]``, which a model never saw in training).
        """
        # encode_batch_fast tokenises with the GIL released (encode holds it): a long prompt
        # tokenised in a worker thread does not stall the other threads
        batch = self.backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        ids = list(batch[0].ids)
        if not add_special_tokens:
            return ids
        pre, suf = self._added_prefix, self._added_suffix
        if pre and ids[len(pre) : 2 * len(pre)] == pre:
            ids = ids[len(pre) :]
        if suf and len(ids) >= 2 * len(suf) and ids[-2 * len(suf) : -len(suf)] == suf:
            ids = ids[: -len(suf)]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 byte sequences decode to U+FFFD.

        Raises:
            ValueError: an id outside ``[0, vocab_size)``.
        """
        ids = [int(i) for i in ids]
        size = self.vocab_size
        bad = [i for i in ids if not 0 <= i < size]
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
            raise ValueError(NO_CHAT_TEMPLATE)
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
        """Build from GGUF ``tokenizer.ggml.*`` / ``tokenizer.chat_template`` metadata values
        (and ``general.architecture``, which picks the SentencePiece variant).

        Generation stops on every end-of-generation token, as llama.cpp decides them: the
        eos, end-of-turn (``eot_token_id``) and end-of-message (``eom_token_id``) ids, and the
        special tokens that end a turn in the common chat templates (:data:`END_OF_TURN_TOKENS`:
        ``<|im_end|>``, ``<end_of_turn>``, ``<|end|>``, ``<|eot_id|>``...) when the vocabulary
        has them.

        Raises:
            ValueError: a tokenizer model other than byte-level BPE ("gpt2") or SentencePiece
                ("llama"), an unknown pre-tokenizer, or missing vocabulary/merges/scores.
        """
        backend = gguf_backend(meta)
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        eos = meta.get("tokenizer.ggml.eos_token_id")
        stops = [
            int(meta[f"tokenizer.ggml.{key}"])
            for key in ("eot_token_id", "eom_token_id")
            if meta.get(f"tokenizer.ggml.{key}") is not None
        ]
        special = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        for text in END_OF_TURN_TOKENS:
            token_id = backend.token_to_id(text)
            if text in special and token_id is not None:
                stops.append(int(token_id))
        return cls(
            backend,
            chat_template=meta.get("tokenizer.chat_template") or None,
            special_tokens={
                "bos_token": special_token(meta, tokens, "bos_token_id"),
                "eos_token": special_token(meta, tokens, "eos_token_id"),
                "unk_token": special_token(meta, tokens, "unknown_token_id"),
                "pad_token": special_token(meta, tokens, "padding_token_id"),
            },
            eos_token_id=None if eos is None else int(eos),
            stop_token_ids=stops,
        )

    @classmethod
    def from_folder(cls, folder: Path, extra_stop_ids: Sequence[int] = ()) -> Tokenizer:
        """Build from a Hugging Face folder: ``tokenizer.json`` + ``tokenizer_config.json``
        (``chat_template``, ``bos_token``, ``eos_token``), or ``chat_template.jinja``. BOS/EOS
        come from the ``tokenizer.json`` post-processor (as transformers' generic
        ``TokenizersBackend`` loads it; ``add_bos_token`` there is not consulted).

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
