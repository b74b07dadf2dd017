"""The model a server serves, as clients see it: its names, context length and tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pagedattn.server.errors import APIError


@dataclass(frozen=True)
class ServedModel:
    """What every route needs to know about the served model.

    Attributes:
        names: the names clients may pass as ``model`` (the first labels metrics and is the
            default in responses).
        max_model_len: the most tokens per request (prompt + completion); None = unbounded.
        tokenizer: the model's tokenizer, or None (token-id prompts only).
    """

    names: tuple[str, ...]
    max_model_len: int | None
    tokenizer: Any

    @classmethod
    def of(
        cls, name: str, aliases: Sequence[str], max_model_len: int | None, tokenizer: Any
    ) -> ServedModel:
        """``name`` first, then the aliases that differ from it."""
        return cls((name, *(a for a in aliases if a != name)), max_model_len, tokenizer)

    @property
    def name(self) -> str:
        """The primary name."""
        return self.names[0]

    def check_model(self, model: str | None) -> None:
        """Raises APIError 404 when ``model`` names another model (None = the served one)."""
        if model is not None and model not in self.names:
            names = ", ".join(f"'{n}'" for n in self.names)
            raise APIError(
                404,
                f"The model '{model}' does not exist; this server serves {names}.",
                param="model",
                code="model_not_found",
            )
