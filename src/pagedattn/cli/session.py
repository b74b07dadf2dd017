"""Chat sessions that survive restarts: the conversation as a small JSON document in the KV store.

The document (``{"format": "pagedattn-session", "version": 1, ...}``) holds the messages and the
exact token ids the model saw and generated, plus the model fingerprint they belong to. It is
parsed as JSON and checked field by field (never unpickled); the KV pages of the conversation
come back from the tier where they are still there and are recomputed where they are not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SESSION_FORMAT = "pagedattn-session"
SESSION_VERSION = 1


def default_store_dir() -> Path:
    """The KV store directory sessions use without ``--kv-store``:
    ``<user cache dir>/pagedattn/kv-store`` (platformdirs)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("pagedattn")) / "kv-store"


def document_name(session: str) -> str:
    """The store document that holds session ``session``.

    Raises:
        ValueError: a name that is not 1-120 characters of ``[A-Za-z0-9._-]``.
    """
    from pagedattn.storage.base import check_document_name

    if len(session) > 120:
        raise ValueError(f"--session: expected at most 120 characters, got {len(session)}")
    try:
        return check_document_name(f"session-{session}")
    except ValueError:
        raise ValueError(
            f"--session: expected letters, digits, '.', '_' or '-', got {session!r}"
        ) from None


def encode_session(conversation: Any, model_fingerprint: str) -> bytes:
    """The JSON document of a :class:`pagedattn.cli.chat.Conversation`."""
    doc = {
        "format": SESSION_FORMAT,
        "version": SESSION_VERSION,
        "model_fingerprint": model_fingerprint,
        "messages": conversation.messages,
        "token_ids": conversation.token_ids,
        "text": conversation.text,
    }
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


def decode_session(data: bytes, model_fingerprint: str, vocab_size: int) -> dict[str, Any]:
    """Parse and check a session document.

    Returns:
        ``{"messages": [{"role", "content"}...], "token_ids": [int...], "text": str}``.

    Raises:
        ValueError: not a session document, another version or model, or a field of the
            wrong type (the message names it).
    """
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"session: not a JSON document ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != SESSION_FORMAT:
        raise ValueError("session: not a pagedattn session document")
    if doc.get("version") != SESSION_VERSION:
        raise ValueError(f"session: version {doc.get('version')!r}, expected {SESSION_VERSION}")
    if doc.get("model_fingerprint") != model_fingerprint:
        raise ValueError(
            "session: it was saved with another model; use another --session name or that model"
        )
    messages, token_ids, text = doc.get("messages"), doc.get("token_ids"), doc.get("text")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict)
        and set(m) == {"role", "content"}
        and all(isinstance(v, str) for v in m.values())
        for m in messages
    ):
        raise ValueError("session: messages must be a list of {role: str, content: str}")
    if not isinstance(token_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in token_ids
    ):
        raise ValueError(f"session: token_ids must be ints in [0, {vocab_size})")
    if not isinstance(text, str):
        raise ValueError("session: text must be a string")
    return {"messages": messages, "token_ids": token_ids, "text": text}
