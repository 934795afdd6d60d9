"""The diagnosis' metrics: values from a pass, and every one documented with the others."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from nodeagent_tiering.pending.metrics import PendingMetrics
from tests.tiering.pending.builders import Cluster, diagnose

DOC = Path(__file__).resolve().parents[3] / "docs" / "tiering.md"
GPU = "nvidia.com/gpu"


def test_every_metric_is_in_the_tiering_metrics_table() -> None:
    section = DOC.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(nodeagent_tiering_[a-z_]+)`", section, flags=re.M))
    names = set()
    for family in PendingMetrics(CollectorRegistry()).__dict__.values():
        for collected in family.collect():
            suffix = "_total" if collected.type == "counter" else ""
            names.add(collected.name + suffix)
    assert names
    assert names - documented == set()


def test_a_pass_sets_the_gauges_and_a_later_one_replaces_them() -> None:
    registry = CollectorRegistry()
    metrics = PendingMetrics(registry)
    fragmented = Cluster().whole("a", used=[4]).whole("b", used=[4]).pending("job", {GPU: 8})
    metrics.observe(diagnose(fragmented.view()), {("contiguity-gpus", "training"): 1900.0})
    value = registry.get_sample_value
    labels = {"reason": "contiguity-gpus", "tier": "training"}
    assert value("nodeagent_tiering_pending_gpu_workloads", labels) == 1
    assert value("nodeagent_tiering_pending_longest_seconds", labels) == 1900
    assert (
        value("nodeagent_tiering_contiguity_blocked_units", {"resource": GPU, "tier": "training"})
        == 8
    )
    assert value("nodeagent_tiering_unusable_free_gpus", {"tier": "training"}) == 8
    assert value("nodeagent_tiering_free_gpus", {"tier": "training"}) == 8
    assert value("nodeagent_tiering_largest_free_nvlink_block_gpus", {"tier": "training"}) == 4
    quiet = Cluster().whole("a", used=[4]).whole("b", used=[4])
    metrics.observe(diagnose(quiet.view()), {})
    assert value("nodeagent_tiering_pending_gpu_workloads", labels) is None
    assert value("nodeagent_tiering_unusable_free_gpus", {"tier": "training"}) == 0
