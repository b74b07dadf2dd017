"""The single-stream front door above the cache: :class:`KVStream`, one token stream through the
paged cache on any array backend, and the `pagedattn demo` run built on it."""

from pagedattn.stream.kv_stream import KVStream

__all__ = ["KVStream"]
