"""PrefixAwareRouter: Ray Serve's request-router API over :class:`PrefixIndex`.

Ray Serve runs one router per ``DeploymentHandle`` in the caller's process (here: the
ingress). Before each choice it hands the router the replicas' latest ``record_routing_stats``
(through ``RunningReplica.routing_stats``); the router hashes the wire request's prompt and
ranks the replicas (:meth:`PrefixIndex.choose`). Ray then sends the request to the first
replica of the first rank that accepts it (``max_ongoing_requests``).

Routers register themselves in :data:`pagedattn.cluster.registry.ROUTERS` under their
deployment's name, so the ingress process can read the replicas' reports (their metrics)
and the router's counters.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from pagedattn.cluster.prefix_index import Choice, PrefixIndex, RouterCounters
from pagedattn.cluster.wire import WireError, prompt_of

logger = logging.getLogger("pagedattn.cluster")


class StatsSource:
    """A router whose replicas' reports (and counters, if any) the ingress can read."""

    def replica_reports(self) -> dict[str, dict[str, Any]]:
        replicas: dict[Any, RunningReplica] = getattr(self, "curr_replicas", {})
        return {rid.unique_id: dict(r.routing_stats or {}) for rid, r in replicas.items()}

    def router_counters(self) -> RouterCounters | None:
        return None

    def register(self) -> None:
        deployment = getattr(self, "_deployment_id", None)
        if deployment is not None:
            import pagedattn.cluster.registry as registry  # the process's one registry

            registry.ROUTERS[deployment.name] = self


def _request_of(pending: PendingRequest | None) -> dict[str, Any] | None:
    if pending is None or not pending.args or not isinstance(pending.args[0], dict):
        return None
    request: dict[str, Any] = pending.args[0]
    return request


class PrefixAwareRouter(StatsSource, RequestRouter):
    """Send a request to the replica holding the longest cached prefix of its prompt, unless
    that replica has more than ``max_load_spread`` requests above the least loaded one.

    ``request_router_kwargs``: ``max_load_spread`` (int, default 4), ``claim_ttl_s`` (float,
    default 30), ``min_match_tokens`` (int, default 32; see :class:`PrefixIndex`).
    """

    def initialize_state(  # type: ignore[override]
        self, max_load_spread: int = 4, claim_ttl_s: float = 30.0, min_match_tokens: int = 32
    ) -> None:
        self.index = PrefixIndex(max_load_spread, claim_ttl_s, min_match_tokens)
        self._choices: dict[str, tuple[Choice, list[str]]] = {}
        self._routed_to: dict[str, str] = {}
        self.register()

    def router_counters(self) -> RouterCounters:
        return self.index.counters

    def _hashes(self, pending: PendingRequest | None) -> list[str]:
        request = _request_of(pending)
        if request is None:
            return []
        try:
            return self.index.page_hashes(prompt_of(request))
        except WireError:
            return []

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        self.index.update_reports(self.replica_reports())
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        hashes = self._hashes(pending_request)
        choice = self.index.choose(sorted(by_id), hashes)
        if pending_request is not None and choice.ranked:
            # reserve the first choice now: requests routed concurrently see each other
            key = pending_request.metadata.internal_request_id
            earlier = self._choices.pop(key, None)
            if earlier is not None:
                self.index.note_completed(earlier[0].ranked[0])
            self.index.note_routed(choice.ranked[0], hashes)
            self._choices[key] = (choice, hashes)
        ranked = [by_id[r] for r in choice.ranked]
        return [ranked[:1], ranked[1:]] if len(ranked) > 1 else [ranked]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        key = pending_request.metadata.internal_request_id
        replica = replica_id.unique_id
        reserved = self._choices.pop(key, None)
        if reserved is None:
            self.index.note_routed(replica, [])
        else:
            choice, hashes = reserved
            self.index.count(choice, replica)
            if choice.ranked[0] != replica:  # Ray sent it elsewhere: move the reservation
                self.index.note_completed(choice.ranked[0])
                self.index.note_routed(replica, hashes)
        self._routed_to[key] = replica

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        replica = self._routed_to.pop(internal_request_id, None)
        if replica is not None:
            self.index.note_completed(replica)
