"""N-gram draft proposer (prompt lookup decoding): the tokens that followed the latest earlier
occurrence of the sequence's last n tokens, in its own prompt and output.

Draft-free speculation as in Saxena, "Prompt Lookup Decoding" (2023) and vLLM's ``ngram``
proposer: requests grounded in their input (quote or summarise a passage, rewrite JSON, edit a
file) copy long runs of it, and a model that repeats itself repeats its own output. Each
sequence keeps one index per n-gram length, updated with the tokens it gained since the last
lookup, so a lookup costs O(new tokens), not O(context).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MATCH_CAP = 32  # longest match length a lookup measures (the policy buckets it far below)


@dataclass(frozen=True)
class Proposal:
    """An n-gram lookup's drafts and how long the match behind them is.

    Attributes:
        token_ids: the drafted tokens (empty: no n-gram matched).
        match_len: how many tokens, ending at the sequence's last one, equal the tokens
            ending at the earlier occurrence the drafts follow (at least the n-gram's length,
            at most :data:`MATCH_CAP`; 0 when nothing matched). A long match means the request
            is copying a run of its context, where drafts are usually right.
    """

    token_ids: list[int] = field(default_factory=list)
    match_len: int = 0


class NgramIndex:
    """Where each n-gram of one token sequence last ended, for ``ngram_min <= n <= ngram_max``.

    Args:
        ngram_min, ngram_max: the n-gram lengths, ``1 <= ngram_min <= ngram_max``.

    Raises:
        ValueError: lengths outside that range.
    """

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(
                f"ngram_min, ngram_max: expected 1 <= min <= max, got {ngram_min}, {ngram_max}"
            )
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        # n -> n-gram -> its latest end position; n-grams ending before ``_indexed`` are in
        self._last_end: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(ngram_min, ngram_max + 1)
        }
        self._indexed = 0

    def propose(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens predicted to follow ``token_ids``.

        The longest n-gram (``ngram_max`` down to ``ngram_min``) ending at the last token that
        also ended at an earlier position ``e`` gives the tokens after ``e``; where they run
        into the end of the sequence the match repeats with its period (a loop of
        ``len - 1 - e`` tokens continues). The most recent earlier occurrence wins.

        Args:
            token_ids: the sequence so far (prompt + output); only ever extended between
                calls (the index keeps what it saw).
            k: most tokens to propose, >= 0.

        Returns:
            The drafted token ids (empty when no n-gram matches or ``k`` is 0).
        """
        return self.lookup(token_ids, k).token_ids

    def lookup(self, token_ids: Sequence[int], k: int) -> Proposal:
        """:meth:`propose`'s drafts with the length of the match behind them: the n-gram
        found, extended backwards while the tokens before both occurrences agree (up to
        :data:`MATCH_CAP`)."""
        n_tokens = len(token_ids)
        if k <= 0 or n_tokens < self.ngram_min + 1:
            return Proposal()
        self._extend(token_ids, n_tokens - 1)  # every n-gram ending before the last token
        for n in range(min(self.ngram_max, n_tokens - 1), self.ngram_min - 1, -1):
            end = self._last_end[n].get(tuple(token_ids[n_tokens - n :]))
            if end is None:
                continue
            period = n_tokens - 1 - end
            draft: list[int] = []
            for i in range(k):
                j = end + 1 + i
                draft.append(int(token_ids[j]) if j < n_tokens else draft[i - period])
            match = n
            while (
                match < MATCH_CAP
                and end - match >= 0
                and token_ids[end - match] == token_ids[n_tokens - 1 - match]
            ):
                match += 1
            return Proposal(draft, match)
        return Proposal()

    def _extend(self, token_ids: Sequence[int], upto: int) -> None:
        """Index the n-grams ending at positions ``_indexed .. upto - 1``."""
        for end in range(self._indexed, upto):
            for n, table in self._last_end.items():
                start = end - n + 1
                if start < 0:
                    break
                table[tuple(token_ids[start : end + 1])] = end
        self._indexed = max(self._indexed, upto)
