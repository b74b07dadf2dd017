"""A :class:`ModelSpec` as plain JSON-able data, so that an engine replica can send it to a
front end that has no model (the cluster's ingress).

The tokenizer travels as its ``tokenizer.json`` text (``tokenizers``' own serialisation) with
its chat template, special tokens and stop ids; the cache and scheduler configurations as
their fields. :func:`spec_from_wire` validates every field (types, ranges, the configs' own
checks) and raises ``ValueError`` naming the one at fault; nothing is unpickled or evaluated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pagedattn.config import CacheConfig, SchedulerConfig
from pagedattn.server.model_spec import ModelSpec

WIRE_VERSION = 1
MAX_TOKENIZER_CHARS = 64 * 1024 * 1024  # the largest tokenizer.json accepted (64 Mi chars)
Scalar = bool | int | float | str | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TokenizerWire(_Strict):
    """A tokenizer's state (see :class:`pagedattn.model.tokenizer.Tokenizer`)."""

    backend_json: str = Field(max_length=MAX_TOKENIZER_CHARS)
    chat_template: str | None
    special_tokens: dict[str, str | None]
    eos_token_id: int | None = Field(ge=0)
    stop_token_ids: list[int]


class ModelSpecWire(_Strict):
    """The wire form of a :class:`ModelSpec`."""

    version: int
    tokenizer: TokenizerWire | None
    vocab_size: int = Field(ge=1)
    logits_size: int = Field(ge=1)
    eos_token_ids: list[int]
    max_model_len: int | None = Field(ge=1)
    num_pages: int = Field(ge=1)
    cache: dict[str, Scalar]
    scheduler: dict[str, Scalar]


def spec_to_wire(spec: ModelSpec) -> dict[str, Any]:
    """``spec`` as a dict of JSON values (:class:`ModelSpecWire`'s fields)."""
    tok = spec.tokenizer
    tokenizer = None
    if tok is not None:
        tokenizer = TokenizerWire(
            backend_json=tok.backend.to_str(),
            chat_template=tok.chat_template,
            special_tokens=dict(tok.special_tokens),
            eos_token_id=tok.eos_token_id,
            stop_token_ids=sorted(int(t) for t in tok.stop_token_ids),
        )
    wire = ModelSpecWire(
        version=WIRE_VERSION,
        tokenizer=tokenizer,
        vocab_size=spec.vocab_size,
        logits_size=spec.logits_size,
        eos_token_ids=sorted(spec.eos_token_ids),
        max_model_len=spec.max_model_len,
        num_pages=spec.num_pages,
        cache=dataclasses.asdict(spec.cache),
        scheduler=dataclasses.asdict(spec.scheduler),
    )
    return wire.model_dump(mode="json")


def _config(cls: type[Any], fields: dict[str, Scalar], name: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"model spec: {name}: unknown fields {unknown}")
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"model spec: {name}: {exc}") from exc


def spec_from_wire(data: Any) -> ModelSpec:
    """The :class:`ModelSpec` a replica sent (:func:`spec_to_wire`).

    Raises:
        ValueError: not a model spec of this version, or a field of the wrong type or out of
            range (the message names it).
    """
    try:
        wire = ModelSpecWire.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ValueError(f"model spec: {where}: {first['msg']}") from None
    if wire.version != WIRE_VERSION:
        raise ValueError(f"model spec: version: expected {WIRE_VERSION}, got {wire.version}")
    tokenizer = None if wire.tokenizer is None else _tokenizer(wire.tokenizer)
    if tokenizer is not None and tokenizer.vocab_size != wire.vocab_size:
        raise ValueError(
            f"model spec: vocab_size: {wire.vocab_size}, but the tokenizer has "
            f"{tokenizer.vocab_size} ids"
        )
    try:
        return ModelSpec(
            tokenizer=tokenizer,
            vocab_size=wire.vocab_size,
            logits_size=wire.logits_size,
            eos_token_ids=frozenset(wire.eos_token_ids),
            max_model_len=wire.max_model_len,
            num_pages=wire.num_pages,
            cache=_config(CacheConfig, wire.cache, "cache"),
            scheduler=_config(SchedulerConfig, wire.scheduler, "scheduler"),
        )
    except ValueError as exc:
        message = str(exc)
        raise ValueError(
            message if message.startswith("model spec:") else f"model spec: {message}"
        ) from None


def _tokenizer(wire: TokenizerWire) -> Any:
    """The tokenizer a :class:`TokenizerWire` describes. Raises ValueError."""
    from tokenizers import Tokenizer as BackendTokenizer

    from pagedattn.model.tokenizer import Tokenizer

    try:
        backend = BackendTokenizer.from_str(wire.backend_json)
    except Exception as exc:  # the tokenizers library raises its own Exception type
        raise ValueError(f"model spec: tokenizer.backend_json: {exc}") from None
    size = int(backend.get_vocab_size(with_added_tokens=True))
    ids = [*wire.stop_token_ids, *([] if wire.eos_token_id is None else [wire.eos_token_id])]
    bad = [t for t in ids if not 0 <= t < size]
    if bad:
        raise ValueError(
            f"model spec: tokenizer.stop_token_ids: expected ids in [0, {size}), got {bad[:5]}"
        )
    try:
        return Tokenizer(
            backend,
            chat_template=wire.chat_template,
            special_tokens=wire.special_tokens,
            eos_token_id=wire.eos_token_id,
            stop_token_ids=wire.stop_token_ids,
        )
    except ValueError as exc:
        raise ValueError(f"model spec: tokenizer: {exc}") from None
