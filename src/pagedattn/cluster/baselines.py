"""Ray Serve's own request routers, to measure the prefix-aware router against.

- ``pow2``: Ray's default, power of two choices over queue lengths.
- ``prefix_tree``: Ray's ``PrefixCacheAffinityRouter`` (an approximate character tree of the
  prompts it routed; it imports without vLLM only from ``ray.llm._internal``). It reads a
  request's prompt text; here the prompt is the wire request's token ids, one character each,
  which is what the tree would see of the rendered text, token by token. Its tree lives in an
  actor, created here by the ingress's router and owned by it, so it goes with the application
  (Ray's own is a detached actor that outlives a deleted application and is reused by the next).

Both register in :data:`pagedattn.cluster.registry.ROUTERS` so ``/metrics`` still shows the
replicas' families.
"""

from __future__ import annotations

from typing import Any, cast

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter

from pagedattn.cluster.router import StatsSource, _request_of
from pagedattn.cluster.wire import prompt_of


class PowerOfTwoBaseline(StatsSource, PowerOfTwoChoicesRequestRouter):
    """Ray's default router."""

    def initialize_state(self, **kwargs: Any) -> None:
        super().initialize_state(**kwargs)  # type: ignore[no-untyped-call]
        self.register()


def _prefix_tree_router() -> type:
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
        PrefixCacheAffinityRouter,
    )
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import (
        PrefixTreeActor,
    )

    class PrefixTreeBaseline(StatsSource, PrefixCacheAffinityRouter):  # type: ignore[misc]
        """Ray's PrefixCacheAffinityRouter over the prompt's token ids."""

        def initialize_state(self, **kwargs: Any) -> None:  # type: ignore[override]
            if kwargs.get("tree_actor") is None:
                kwargs["tree_actor"] = cast(Any, PrefixTreeActor).options(num_cpus=0).remote()
            super().initialize_state(**kwargs)
            self.register()

        def _extract_text_from_request(self, pending_request: Any) -> str:
            request = _request_of(pending_request)
            if request is None:
                return ""
            return "".join(chr(0x100 + t) for t in prompt_of(request))

    PrefixTreeBaseline.__qualname__ = "PrefixTreeBaseline"
    return PrefixTreeBaseline


def __getattr__(name: str) -> Any:
    """``PrefixTreeBaseline``, imported on first use (Ray Serve finds a router class by its
    module and name)."""
    if name == "PrefixTreeBaseline":
        return BASELINES["prefix_tree"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Lazy(dict[str, Any]):
    def __missing__(self, key: str) -> Any:
        if key != "prefix_tree":
            raise KeyError(key)
        self[key] = _prefix_tree_router()
        return self[key]


#: router name -> class (``prefix_tree`` is imported on first use).
BASELINES: dict[str, Any] = _Lazy(pow2=PowerOfTwoBaseline)
ROUTER_NAMES = ("pow2", "prefix_tree")
