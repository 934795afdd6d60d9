"""The tiering service counts a node's physical GPUs whatever GFD's ``gpu.count`` counts."""

from __future__ import annotations

from collections.abc import Callable

from nodeagent import labels as lbl
from nodeagent.gpu.node import GpuNode
from nodeagent.published import encode, publish
from nodeagent_tiering.cluster.nodes import Node


def _view(labels: dict[str, str], annotations: dict[str, str]) -> Node:
    return Node.from_object(
        {"metadata": {"name": "n1", "labels": labels, "annotations": annotations}}
    )


def test_single_strategy_mig_node_counts_its_gpus_not_its_mig_devices(
    make_node: Callable[..., GpuNode],
) -> None:
    state = encode(publish(make_node("dgx-h100").snapshot()))
    labels = {lbl.GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", lbl.GPU_COUNT: "56"}
    assert _view(labels, {lbl.GPU_STATE_ANNOTATION: state}).gpus == 8
    # Without the published state nothing says how many GPUs back the 56 MIG devices.
    assert _view(labels, {}).gpus == 0


def test_whole_gpu_node_counts_from_the_label() -> None:
    labels = {lbl.GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3", lbl.GPU_COUNT: "8"}
    assert _view(labels, {}).gpus == 8
    assert _view({lbl.GPU_COUNT: "eight"}, {}).gpus == 0
