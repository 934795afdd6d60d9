"""Capability labels from a node snapshot (GFD names), and patching only on change."""

from __future__ import annotations

import pytest

from nodeagent import labels as lbl

FACTS = lbl.NodeFacts(
    pool="training pool", gpu_health="healthy", stability="stable", mig_strategy="single"
)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        pytest.param(
            "dgx-h100",
            {
                lbl.GPU_COUNT: "8",
                lbl.GPU_COMPUTE_MAJOR: "9",
                lbl.GPU_COMPUTE_MINOR: "0",
                lbl.GPU_FAMILY: "hopper",
                lbl.MIG_CAPABLE: "true",
                lbl.MIG_STRATEGY: "single",
                lbl.NVLINK_LARGEST_SET: "8",
                lbl.POOL: "training-pool",
            },
            id="dgx-h100: 8 NVSwitch-connected MIG-capable Hopper GPUs",
        ),
        pytest.param(
            "pcie-h100nvl",
            {lbl.GPU_COUNT: "4", lbl.NVLINK_LARGEST_SET: "2"},
            id="pcie-h100nvl: NVLink-bridged pairs",
        ),
        pytest.param(
            "pcie-l40s",
            {
                lbl.GPU_COUNT: "8",
                lbl.NVLINK_LARGEST_SET: "1",
                lbl.MIG_CAPABLE: "false",
                lbl.GPU_FAMILY: "ada-lovelace",
            },
            id="pcie-l40s: no NVLink, no MIG",
        ),
    ],
)
def test_capability_labels(make_node, preset, expected):
    snapshot = make_node(preset).snapshot()
    labels = lbl.capability_labels(snapshot, FACTS)
    assert {k: labels.get(k) for k in expected} == expected
    # GFD writes the strategy the plugin runs under, MIG-capable GPUs or not.
    assert labels[lbl.MIG_STRATEGY] == "single"
    first = snapshot.gpus[0].info
    assert labels[lbl.GPU_PRODUCT] == first.name.replace(" ", "-")
    assert labels[lbl.GPU_MEMORY] == str(first.memory_total_bytes // 2**20)
    major, minor, *_ = snapshot.driver_version.split(".")
    assert (labels[lbl.CUDA_DRIVER_MAJOR], labels[lbl.CUDA_DRIVER_MINOR]) == (major, minor)
    assert labels[lbl.DRIVER_VERSION] == snapshot.driver_version
    for key, value in labels.items():
        assert len(value) <= 63, key
        assert value == lbl.label_value(value), f"{key}={value!r} is not a valid label value"


@pytest.mark.parametrize(
    ("current", "desired", "patch"),
    [
        pytest.param({"a": "1", lbl.GPU_COUNT: "8"}, {lbl.GPU_COUNT: "8"}, {}, id="unchanged"),
        pytest.param(
            {lbl.STABILITY: "stable"},
            {lbl.STABILITY: "unstable"},
            {lbl.STABILITY: "unstable"},
            id="changed value",
        ),
        pytest.param(
            {lbl.MIG_STRATEGY: "single", "team": "x"},
            {},
            {lbl.MIG_STRATEGY: None},
            id="stale agent label removed, others' labels kept",
        ),
        pytest.param({lbl.TIER: "training"}, {}, {}, id="the tier label belongs to the service"),
    ],
)
def test_label_patch(current, desired, patch):
    assert lbl.label_patch(current, desired) == patch
    assert lbl.labels_changed(current, desired) is bool(patch)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", id="spaces"),
        pytest.param("  x/y  ", "x-y", id="slash and padding"),
        pytest.param("a" * 80, "a" * 63, id="truncated to 63"),
    ],
)
def test_label_value(text, value):
    assert lbl.label_value(text) == value


def test_narrower_ownership_keeps_the_health_reporters_labels():
    current = {lbl.STABILITY: "unstable", lbl.GPU_COUNT: "8"}
    capability_only = [k for k in lbl.AGENT_LABELS if k != lbl.STABILITY]
    assert lbl.label_patch(current, {lbl.GPU_COUNT: "8"}, capability_only) == {}
