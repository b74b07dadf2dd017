"""The base of every request model: strict types, finite numbers, text that is Unicode.

OpenAI's API refuses a value of the wrong type rather than coercing it; so do these models
(pydantic's strict mode: ``true`` is not an integer, ``"10"`` is not one either, an integer is
a valid float), with ``Infinity`` / ``NaN`` refused (``allow_inf_nan=False``). A JSON string may
spell a lone UTF-16 surrogate (``"\\ud800"``), which Python decodes to a ``str`` no encoder
accepts: it is refused before validation, naming where it sits (error type
:data:`LONE_SURROGATE`, the top-level field in the error's ``ctx["field"]``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

LONE_SURROGATE = "string_lone_surrogate"  # the pydantic error type of a lone surrogate


def _has_lone_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def lone_surrogate_path(value: Any) -> tuple[str | int, ...] | None:
    """Where a string (or an object key) holding a lone UTF-16 surrogate sits in a decoded
    JSON value, as a path of keys and indices; None when there is none."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _has_lone_surrogate(item):
                return path
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str) and _has_lone_surrogate(key):
                    return (*path, key)
                stack.append(((*path, key), child))
        elif isinstance(item, (list, tuple)):
            stack.extend(((*path, i), child) for i, child in reversed(list(enumerate(item))))
    return None


class OpenAIRequest(BaseModel):
    """Base of every request model: strict types, finite numbers, no lone surrogates; unknown
    fields are kept in ``model_extra`` (the routes refuse or pass them on by name)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _refuse_lone_surrogates(cls, data: Any) -> Any:
        path = lone_surrogate_path(data)
        if path:
            where = ".".join(  # a key may be the culprit: escape it
                str(part).encode("utf-8", "backslashreplace").decode() for part in path
            )
            raise PydanticCustomError(
                LONE_SURROGATE,
                "{where}: holds a lone UTF-16 surrogate, which is not valid Unicode text",
                {"where": where, "field": where.split(".", 1)[0]},
            )
        return data
