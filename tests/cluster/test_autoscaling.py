"""Autoscaling options are honoured (the engine deployment grows from one replica to two under
load, and the router uses the new one) or refused with an error naming the option, never
dropped (Ray Serve's own config would silently drop an unknown key)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pagedattn.cluster.app import build_cluster_app
from pagedattn.cluster.ingress import REPLICA_HEADER
from tests.cluster.conftest import Cluster

CLUSTER_OPTIONS = {
    "autoscaling": {
        "min_replicas": 1,
        "initial_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 1,
        "upscale_delay_s": 0.5,
        "downscale_delay_s": 600,
        "look_back_period_s": 1.0,
    },
    "max_load_spread": 0,
}


def test_the_deployment_scales_up_under_load_and_the_new_replica_serves(
    cluster: Cluster,
) -> None:
    assert len(cluster.replicas()) == 1
    (first,) = cluster.replicas()

    def ask(i: int) -> str:
        r = cluster.chat(
            [{"role": "user", "content": f"story {i}"}], max_tokens=160, ignore_eos=True
        )
        assert r.status_code == 200, r.text
        return r.headers[REPLICA_HEADER]

    with ThreadPoolExecutor(6) as pool:
        deadline = time.monotonic() + 90
        while len(cluster.replicas()) < 2:  # waves of 6 requests in flight
            assert time.monotonic() < deadline, "the autoscaler added no replica in 90 s"
            list(pool.map(ask, range(6)))
        assert first in cluster.replicas()
        # the router sends to the new one too (once it answers Ray's queue-length probes)
        served: set[str] = set()
        deadline = time.monotonic() + 60
        while served != cluster.replicas() and time.monotonic() < deadline:
            served |= set(pool.map(ask, range(6)))
    assert served == cluster.replicas(), served


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"min_replicas": 1, "max_replica": 2}, "unknown option(s) max_replica"),
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas (2) must be greater"),
        ({"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": -1}, "target"),
    ],
)
def test_autoscaling_options_serve_does_not_take_are_refused(
    tiny_gguf: Path, options: dict[str, int], needle: str
) -> None:
    with pytest.raises(ValueError, match="autoscaling") as err:
        build_cluster_app(str(tiny_gguf), autoscaling=options)
    assert needle in str(err.value)


def test_replicas_and_autoscaling_together_are_refused(tiny_gguf: Path) -> None:
    with pytest.raises(ValueError, match="replicas: give either"):
        build_cluster_app(
            str(tiny_gguf), replicas=2, autoscaling={"min_replicas": 1, "max_replicas": 2}
        )
