"""The one parsed Node and the raw Pod readers of the floor: what the areas read instead of
parsing objects themselves."""

from __future__ import annotations

import re

from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.cluster.view import request_amounts

GPUS = re.compile(r"nvidia\.com/(gpu|mig-.*)$")


def node(conditions: list[dict[str, str]], allocatable: dict[str, object]) -> Node:
    return Node.from_object(
        {
            "metadata": {"name": "n1", "resourceVersion": "7"},
            "status": {"conditions": conditions, "allocatable": allocatable},
        }
    )


def test_ready_is_read_from_the_kubelet_condition_and_a_missing_one_is_not_a_fault() -> None:
    assert node([{"type": "Ready", "status": "False"}], {}).not_ready
    assert node([{"type": "Ready", "status": "Unknown"}], {}).not_ready
    assert not node([{"type": "Ready", "status": "True"}], {}).not_ready
    assert not node([], {}).not_ready


def test_allocatable_amounts_take_the_matching_names_and_skip_refused_values() -> None:
    n = node([], {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "2k", "cpu": "500m"})
    assert n.amounts(GPUS) == {"nvidia.com/gpu": 8.0, "nvidia.com/mig-1g.10gb": 2000.0}
    assert node([], {"nvidia.com/gpu": "1e400"}).amounts(GPUS) == {}


def test_pod_requests_sum_containers_prefer_requests_and_drop_zero_or_bad() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "1"}}},
                {
                    "resources": {
                        "limits": {"nvidia.com/gpu": "4"},
                        "requests": {"nvidia.com/gpu": "1"},
                    }
                },
                {"resources": {"limits": {"nvidia.com/mig-1g.10gb": "0", "nvidia.com/gpu": "x"}}},
            ]
        }
    }
    assert request_amounts(pod, GPUS) == {"nvidia.com/gpu": 3.0}
