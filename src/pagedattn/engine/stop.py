"""Stop strings over streamed text: never emit a stop string, nor anything after it.

Text arrives as deltas (one per generated token, from the incremental detokenizer). A stop
string may span several deltas, so the tail of the text that could still become a stop string
is held back until a later delta rules it out, as vLLM's detokenizer does. When generation ends
for another reason (length, end-of-sequence) the held-back text is flushed: it was not a stop.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringTracker:
    """Accumulates one request's output text and decides what may be emitted.

    Args:
        stop: the request's stop strings (non-empty); may be empty (nothing is held back).
        include_stop_str: keep the matched stop string at the end of the text.

    Raises:
        ValueError: an empty stop string.
    """

    def __init__(self, stop: Sequence[str], include_stop_str: bool = False) -> None:
        if any(not s for s in stop):
            raise ValueError(f"stop: expected non-empty strings, got {list(stop)!r}")
        self.stop = tuple(stop)
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self.text = ""  # all kept output text (truncated at a stop string once one matched)
        self.num_emitted = 0  # characters of ``text`` already handed out
        self.stopped = False
        self.include_stop_str = include_stop_str
        self.matched: str | None = None  # the stop string that matched

    def add(self, delta: str, check: bool = True) -> tuple[str, bool]:
        """Append a text delta.

        Args:
            delta: new text of the latest token (may be empty).
            check: look for stop strings (False while ``min_tokens`` are not reached: the
                text is kept and emitted, nothing is held back).

        Returns:
            (text that may be emitted now, True when a stop string matched). After a match the
            text ends right before the stop string and further deltas are ignored.
        """
        if self.stopped:
            return "", True
        # A match must end inside the new delta, so it starts at most max_stop_len - 1
        # characters before it.
        search_from = max(0, len(self.text) - self.max_stop_len + 1)
        self.text += delta
        if not check:
            return self._emit(len(self.text)), False
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
        if hits:
            match, self.matched = min(hits)
            end = match + len(self.matched) if self.include_stop_str else match
            self.text = self.text[:end]
            self.stopped = True
            return self._emit(len(self.text)), True
        return self._emit(len(self.text) - self._held_back()), False

    def flush(self) -> str:
        """All text not emitted yet (call when generation ends for a reason other than stop)."""
        return self._emit(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        longest = min(self.max_stop_len - 1, len(self.text) - self.num_emitted)
        for k in range(longest, 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stop):
                return k
        return 0

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.num_emitted)
        out = self.text[self.num_emitted : upto]
        self.num_emitted = upto
        return out
