"""GPU utilisation and memory per team from a real Prometheus: the agents' metrics joined with
pod attribution, averaged over the period. Prometheus scrapes a prepared metrics page, as the
agent would serve it, labelled with the node's name the way a scrape config does."""

from __future__ import annotations

import pytest

from nodeagent import labels as lbl
from nodeagent.testing.prometheus import MetricsPage, PrometheusServer
from nodeagent_tiering.cluster import kueue
from nodeagent_tiering.review.inputs import ReviewInputs
from nodeagent_tiering.review.prometheus import query_usage
from nodeagent_tiering.review.quota import build_section
from tests.deploy.tools import require_tool
from tests.tiering.quota.conftest import quota_policy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GiB = 2**30


def page(held_by_b: bool) -> str:
    """Three whole GPUs and a MIG device; team a's pods hold GPU-a and GPU-b, team b's a MIG
    device (no utilisation metric of its own) and, in the second half, GPU-c."""
    lines = [
        "# TYPE nodeagent_gpu_utilization_ratio gauge",
        'nodeagent_gpu_utilization_ratio{gpu="0",uuid="GPU-a"} 0.2',
        'nodeagent_gpu_utilization_ratio{gpu="1",uuid="GPU-b"} 0.6',
        'nodeagent_gpu_utilization_ratio{gpu="2",uuid="GPU-c"} 0.9',
        "# TYPE nodeagent_gpu_memory_used_bytes gauge",
        f'nodeagent_gpu_memory_used_bytes{{gpu="0",uuid="GPU-a"}} {10 * GiB}',
        f'nodeagent_gpu_memory_used_bytes{{gpu="1",uuid="GPU-b"}} {30 * GiB}',
        f'nodeagent_gpu_memory_used_bytes{{gpu="2",uuid="GPU-c"}} {70 * GiB}',
        "# TYPE nodeagent_device_plugin_pod_devices gauge",
    ]
    held = [
        ("nvidia.com/gpu", "0", "GPU-a", "", "", "train-0", "team-a"),
        ("nvidia.com/gpu", "1", "GPU-b", "", "", "train-1", "team-a"),
        ("nvidia.com/mig-1g.10gb", "3", "MIG-x", "1g.10gb", "9", "infer-0", "team-b"),
    ]
    if held_by_b:
        held.append(("nvidia.com/gpu", "2", "GPU-c", "", "", "infer-1", "team-b"))
    for resource, gpu, uuid, profile, instance, pod, ns in held:
        lines.append(
            f'nodeagent_device_plugin_pod_devices{{resource="{resource}",gpu="{gpu}",'
            f'uuid="{uuid}",mig_profile="{profile}",mig_instance="{instance}",pod="{pod}",'
            f'namespace="{ns}",container="main"}} 1'
        )
    return "\n".join(lines) + "\n"


@pytest.fixture
def prometheus(tmp_path):
    binary = require_tool("prometheus")
    metrics = MetricsPage(page(held_by_b=False))
    server = PrometheusServer(
        binary, tmp_path / "prom", [metrics.target], target_labels={"node": "gpu-node-1"}
    )
    yield server, metrics
    server.stop()
    metrics.close()


def test_utilisation_and_memory_per_team_weighted_by_time_held(prometheus):
    server, metrics = prometheus
    server.wait_for("count(nodeagent_device_plugin_pod_devices)", lambda r: bool(r), 60)
    server.wait_for(
        'count_over_time(nodeagent_device_plugin_pod_devices{uuid="GPU-a"}[1m])',
        lambda r: bool(r) and float(r[0]["value"][1]) >= 4,
        60,
    )
    metrics.text = page(held_by_b=True)
    server.wait_for(
        'count_over_time(nodeagent_device_plugin_pod_devices{uuid="GPU-c"}[1m])',
        lambda r: bool(r) and float(r[0]["value"][1]) >= 4,
        60,
    )
    usage = query_usage(server.url, "node", period_s=120, step_s=1)
    a = ("gpu-node-1", "team-a")
    b = ("gpu-node-1", "team-b")
    # Two GPUs held all along: every step counts both, at 0.2 and 0.6.
    assert usage.samples[a] > 0
    assert usage.utilisation[a] / usage.samples[a] == pytest.approx(0.4)
    assert usage.memory[a] / usage.samples[a] == pytest.approx(20 * GiB)
    # The MIG device counts for nothing; GPU-c only while team b's pod held it.
    assert usage.utilisation[b] / usage.samples[b] == pytest.approx(0.9)
    assert usage.samples[b] < usage.samples[a] / 2
    # In the review, by team (the quota policy maps namespaces to teams) and the node's tier.
    policy = quota_policy(
        {
            "version": "v1",
            "teams": [
                {
                    "name": name,
                    "namespaces": [f"team-{name}"],
                    "tiers": {"general": {"resources": {"nvidia.com/gpu": {"guaranteed": 1}}}},
                }
                for name in ("a", "b")
            ],
        }
    )
    node = {"metadata": {"name": "gpu-node-1", "labels": {lbl.TIER: "general"}}, "status": {}}
    inputs = ReviewInputs(now_s=0, period_s=120, nodes=[node], kueue=kueue.KueueApi("v1beta2"))
    section = build_section(inputs, policy=policy, prometheus=usage, prometheus_source="test")
    rows = {(r.tier, r.team): r for r in section.rows}
    assert rows[("general", "a")].utilisation == pytest.approx(0.4)
    assert rows[("general", "a")].memory_used_bytes == pytest.approx(20 * GiB)
    assert rows[("general", "a")].observed_gpu_hours == pytest.approx(usage.samples[a] / 3600)
    assert rows[("general", "b")].utilisation == pytest.approx(0.9)
