"""Lark rules (llguidance's dialect) for free text that switches to a constrained segment when
a trigger appears: the lazy-trigger pieces shared by ``tool_choice: "auto"``
(:func:`pagedattn.server.tool_format.auto_grammar`) and vLLM's ``structural_tag``
(:mod:`pagedattn.server.structural_tag`).

- :func:`head_rules`: a rule matching free text up to and including a trigger. Its text part
  is a lazy lexeme (it ends at the first occurrence of the trigger), so the segment's
  constraint applies from the byte after the trigger on.
- :func:`free_text_rule`: ``TEXT``, free text that contains none of the triggers (the text
  after the last segment, or an output without segments).
- :func:`literal`: a fixed string.

A trigger (or fixed string) that is one special token of the vocabulary is matched by
llguidance only by name, never as text: ``special`` names those, and each may then come as its
text or as that token.
"""

from __future__ import annotations

import json
from collections.abc import Iterable


def regex_escape(text: str) -> str:
    """``text`` as a regex of llguidance's ``/.../`` literals: ASCII letters, digits, ``_``
    and space as they are, every other character as ``\\x{..}`` (so no character is a regex
    operator, a lexeme operator or the literal's closing ``/``)."""
    keep = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_ ")
    return "".join(ch if ch in keep else f"\\x{{{ord(ch):X}}}" for ch in text)


def literal(text: str, special: frozenset[str]) -> str:
    """A Lark expression matching ``text`` exactly (also as its special token when it is one)."""
    quoted = json.dumps(text)
    return f"({quoted} | {text})" if text in special else quoted


def head_rules(name: str, trigger: str, special: frozenset[str]) -> list[str]:
    """Rules defining ``name``: free text (without any trigger) followed by ``trigger``.

    The free text of the special-token alternative is ``TEXT`` (:func:`free_text_rule`).
    """
    text_rule = f"{name}_text"
    alternative = f" | TEXT {trigger}" if trigger in special else ""
    return [
        f"{text_rule}[lazy]: /(?s:.*){regex_escape(trigger)}/",
        f"{name}: {text_rule}{alternative}",
    ]


def free_text_rule(triggers: Iterable[str]) -> str:
    """The ``TEXT`` lexeme: any text that contains none of ``triggers`` (non-empty strings)."""
    alternatives = "|".join(regex_escape(t) for t in sorted(set(triggers)))
    return f"TEXT: /(?s:.*)/ & ~/(?s:.*)(?:{alternatives})(?s:.*)/"
