"""The NumPy decoder under its first name: :class:`LlamaModel` is
:class:`pagedattn.model.decoder.DecoderModel`, which runs every family of
:mod:`pagedattn.model.architecture`, Llama included."""

from __future__ import annotations

from pagedattn.model.decoder import FUSED_MAX_ROWS, DecoderModel

LlamaModel = DecoderModel

__all__ = ["FUSED_MAX_ROWS", "DecoderModel", "LlamaModel"]
