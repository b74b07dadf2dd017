"""Small named documents in a KV store (a chat session's conversation): their size bound and
the errors of reading and replacing one.

A document is read only when its size, known before reading (a file's metadata, a bounded
Redis ``GETRANGE``), is within :data:`MAX_DOCUMENT_BYTES`; a larger one is counted
(``document_size``) and refused with :class:`DocumentTooLargeError`, never read whole.
:meth:`replace_document` is a compare-and-swap: it writes only when the stored document is still
the one the writer read (a file lock on disk, ``WATCH``/``MULTI`` on Redis), so that two writers
of one document never lose a turn without a word: the second gets :class:`DocumentConflictError`.
"""

from __future__ import annotations

#: The largest document a store reads or writes (a session of a full context of token ids and
#: its text is well under a megabyte).
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024


class DocumentTooLargeError(ValueError):
    """A stored document is larger than :data:`MAX_DOCUMENT_BYTES` (it was not read)."""

    def __init__(self, name: str, size: int | None = None) -> None:
        got = "more" if size is None else f"{size} bytes,"
        super().__init__(
            f"document {name!r}: {got} than the {MAX_DOCUMENT_BYTES} bytes a document may have"
        )


class DocumentConflictError(RuntimeError):
    """The stored document changed since the writer read it (another writer saved first)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"document {name!r} was changed by another writer since it was read")


def check_document_size(name: str, data: bytes) -> bytes:
    """``data``, when it is within :data:`MAX_DOCUMENT_BYTES`.

    Raises:
        DocumentTooLargeError: it is not.
    """
    if len(data) > MAX_DOCUMENT_BYTES:
        raise DocumentTooLargeError(name, len(data))
    return data
