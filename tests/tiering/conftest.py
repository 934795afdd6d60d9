"""Fixtures: the API stand-in, a client against it, a fake clock and controller factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nodeagent import labels as lbl
from nodeagent.testing.clock import FakeClock
from nodeagent_tiering.controller import Controller
from nodeagent_tiering.kube import Kube, NodeCache, api_client
from nodeagent_tiering.leader import LeaderElector, LeaseTiming
from nodeagent_tiering.policy import TierPolicy, parse_policy
from tests.support.kubeapi import KubeAPIServer, make_node

POLICY: dict[str, Any] = {
    "version": "v1",
    "tiers": [
        {
            "name": "training",
            "selector": {
                "match_labels": {lbl.GPU_COUNT: "8", lbl.NVLINK_LARGEST_SET: "8"},
                "match_expressions": [
                    {
                        "key": lbl.GPU_PRODUCT,
                        "operator": "In",
                        "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"],
                    }
                ],
            },
            "stability": ["stable"],
            "min_healthy": 1,
            "max_draining": 1,
        },
        {"name": "general", "selector": {"match_labels": {lbl.GPU_COUNT: "8"}}},
        {"name": "shared", "min_healthy": 0, "max_draining": "50%"},
    ],
    "recovery_period_s": 600,
    "budget": {"max_draining": 2, "cooldown_s": 0},
    "breaker": {"percentage": 50, "window_s": 300, "min_unstable": 2},
}


def gpu_labels(
    product: str = "NVIDIA-H100-80GB-HBM3",
    count: int = 8,
    nvlink: int = 8,
    stability: str = "stable",
) -> dict[str, str]:
    """Labels an agent publishes on a GPU node."""
    return {
        lbl.GPU_PRODUCT: product,
        lbl.GPU_COUNT: str(count),
        lbl.NVLINK_LARGEST_SET: str(nvlink),
        lbl.STABILITY: stability,
        lbl.GPU_HEALTH: "healthy" if stability != "unstable" else "unhealthy",
        lbl.POOL: "default",
        lbl.DRIVER_VERSION: "550.54.15",
    }


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as server:
        yield server


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def policy() -> TierPolicy:
    return parse_policy(POLICY)


@pytest.fixture
def make_controller(
    api: KubeAPIServer, clock: FakeClock, policy: TierPolicy
) -> Callable[..., Controller]:
    """Factory: a controller on the stand-in; ``elect=True`` adds a leader elector."""

    def make(
        *,
        dry_run: bool = False,
        elect: bool = False,
        identity: str = "replica-a",
        pol: TierPolicy | None = None,
    ) -> Controller:
        kube = Kube(api_client(server=api.url))
        cache = NodeCache(kube)
        cache.relist()
        elector = None
        if elect:
            elector = LeaderElector(
                kube,
                namespace="nodeagent",
                name="nodeagent-tiering",
                identity=identity,
                clock=clock,
                timing=LeaseTiming(15, 10, 2),
            )
        return Controller(kube, cache, pol or policy, clock=clock, elector=elector, dry_run=dry_run)

    return make


def add_nodes(api: KubeAPIServer, spec: dict[str, dict[str, str]]) -> None:
    """Create nodes from a name -> labels mapping."""
    for name, labels in spec.items():
        api.put("nodes", make_node(name, labels))
