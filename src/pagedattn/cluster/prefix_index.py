"""Which replica holds the longest cached prefix of a prompt, and the load guard (no Ray here).

Facts come from two places:

- each replica's report (``record_routing_stats``): the hashes of every page its prefix index
  holds, computed by the engine itself; replaced wholesale by the next report, so pages the
  replica evicted drop out;
- the requests this router sent (``note_routed``): the prompt's pages will be on that replica
  once its prefill ran, before its next report says so; such a claim lives ``claim_ttl_s``.

A prompt's pages are hashed exactly as the engine's cache does
(:func:`pagedattn.cache.hashing.prefix_page_hashes` with the replicas' own cache namespace and
page size), so a match of ``k`` pages means the first ``k`` pages of the prompt are cached
there. A match shorter than ``min_match_tokens`` (a chat template's opening, a few common
words) saves too little prefill to be worth a queue: such a request goes by load. The prefix
only decides while the chosen replica's load (requests in flight) is at most
``max_load_spread`` above the least loaded one's; past that the request goes by load.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pagedattn.cache.hashing import prefix_page_hashes

HASH_HEX = 16  # hex digits per page hash in the reports (see pagedattn.cluster.replica)

REASON_PREFIX = "prefix"  # the replica with the longest cached prefix
REASON_LOAD = "load"  # the longest prefix's replica was too busy: the least loaded one
REASON_NO_MATCH = "no_match"  # no replica holds min_match_tokens of the prompt: the least loaded
REASONS = (REASON_PREFIX, REASON_LOAD, REASON_NO_MATCH)


@dataclass
class Choice:
    """A routing decision: replicas in order of preference, why, and the match length."""

    ranked: list[str]
    reason: str
    matched_pages: int
    prompt_pages: int
    matches: dict[str, int] = field(default_factory=dict)


@dataclass
class RouterCounters:
    """Totals since the router started: requests per reason, pages matched and hashed."""

    routed: Counter[str] = field(default_factory=Counter)
    matched_pages: int = 0
    prompt_pages: int = 0


class PrefixIndex:
    """The router's view of every replica's cached pages, and the choice it makes.

    Args:
        max_load_spread: most requests in flight the longest-prefix replica may have above the
            least loaded replica and still be chosen.
        claim_ttl_s: how long a page claimed by a routed request counts without a report.
        min_match_tokens: the shortest cached prefix that decides (rounded up to pages).
    """

    def __init__(
        self, max_load_spread: int = 4, claim_ttl_s: float = 30.0, min_match_tokens: int = 32
    ) -> None:
        if max_load_spread < 0:
            raise ValueError(f"max_load_spread: expected >= 0, got {max_load_spread}")
        self.max_load_spread = max_load_spread
        self.claim_ttl_s = claim_ttl_s
        self.min_match_tokens = min_match_tokens
        self.reported: dict[str, frozenset[str]] = {}
        self.reported_load: dict[str, int] = {}
        self.claims: dict[str, dict[str, float]] = {}  # replica -> page hash -> expiry
        self.in_flight: Counter[str] = Counter()
        self.namespace: bytes | None = None
        self.page_size: int | None = None
        self.counters = RouterCounters()

    # ---- facts -------------------------------------------------------------------------------
    def update_reports(self, reports: Mapping[str, Mapping[str, Any]]) -> None:
        """Take the latest report of every live replica (replica id -> its routing stats);
        replicas absent from ``reports`` are forgotten."""
        for gone in set(self.reported) | set(self.claims):
            if gone not in reports:
                self.reported.pop(gone, None)
                self.reported_load.pop(gone, None)
                self.claims.pop(gone, None)
        for rid, stats in reports.items():
            if not stats or "page_hashes" not in stats:
                continue  # no report yet
            self.reported[rid] = frozenset(stats["page_hashes"])
            self.reported_load[rid] = int(stats.get("num_requests", 0))
            if self.namespace is None:
                self.namespace = bytes.fromhex(stats["namespace"])
                self.page_size = int(stats["page_size"])

    def page_hashes(self, prompt_token_ids: Sequence[int]) -> list[str]:
        """The prompt's full pages' hashes (as reported), or [] before any report."""
        if self.namespace is None or self.page_size is None:
            return []
        hashes = prefix_page_hashes(list(prompt_token_ids), self.page_size, self.namespace)
        return [h.hex()[:HASH_HEX] for h in hashes]

    def note_routed(self, replica: str, hashes: Sequence[str]) -> None:
        """A request with these page hashes went to ``replica``."""
        expiry = time.monotonic() + self.claim_ttl_s
        claims = self.claims.setdefault(replica, {})
        for h in hashes:
            claims[h] = expiry
        self.in_flight[replica] += 1

    def note_completed(self, replica: str) -> None:
        if self.in_flight[replica] > 0:
            self.in_flight[replica] -= 1

    # ---- the choice --------------------------------------------------------------------------
    def load(self, replica: str) -> int:
        """Requests in flight: what this router sent, or what the replica reported if more
        (other routers send to it too)."""
        return max(self.in_flight[replica], self.reported_load.get(replica, 0))

    def matched(self, replica: str, hashes: Sequence[str]) -> int:
        """How many leading pages of ``hashes`` the replica holds (reported or claimed)."""
        reported = self.reported.get(replica, frozenset())
        claims = self.claims.get(replica, {})
        now = time.monotonic()
        n = 0
        for h in hashes:
            if h not in reported and claims.get(h, 0.0) < now:
                break
            n += 1
        return n

    def choose(self, replicas: Sequence[str], hashes: Sequence[str]) -> Choice:
        """Rank ``replicas`` for a prompt with these page hashes (see the module docstring)."""
        if not replicas:
            return Choice([], REASON_NO_MATCH, 0, len(hashes))
        match = {r: self.matched(r, hashes) for r in replicas}
        load = {r: self.load(r) for r in replicas}

        def size(r: str) -> int:
            return len(self.reported.get(r, ())) + len(self.claims.get(r, ()))

        by_load = sorted(replicas, key=lambda r: (load[r], size(r), r))
        best = max(replicas, key=lambda r: (match[r], -load[r], -size(r)))
        least = load[by_load[0]]
        min_pages = max(1, -(-self.min_match_tokens // (self.page_size or 1)))
        if match[best] < min_pages:
            return Choice(by_load, REASON_NO_MATCH, 0, len(hashes), match)
        if load[best] - least > self.max_load_spread:
            return Choice(by_load, REASON_LOAD, match[by_load[0]], len(hashes), match)
        rest = [r for r in by_load if r != best]
        return Choice([best, *rest], REASON_PREFIX, match[best], len(hashes), match)

    def count(self, choice: Choice, replica: str) -> None:
        """Count a request routed to ``replica`` after ``choice`` (the match counted is the
        replica's own: Ray may send it to a later-ranked replica when the first is full)."""
        reason = choice.reason
        if reason == REASON_PREFIX and choice.ranked and replica != choice.ranked[0]:
            reason = REASON_LOAD
        self.counters.routed[reason] += 1
        self.counters.matched_pages += choice.matches.get(replica, 0)
        self.counters.prompt_pages += choice.prompt_pages
