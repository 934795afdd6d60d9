"""The review judges a shared GPU's interference by its SM and DRAM activity where measured."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from nodeagent import labels as lbl
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import Profiling
from nodeagent.published import PublishedError, PublishedGpu, PublishedNode, decode, encode, publish
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.review.sharing import judged, sharing_section


def _profiling(sm: float | None, dram: float | None) -> Profiling:
    return Profiling(
        interval_s=5.0,
        graphics_active_ratio=0.99,
        sm_active_ratio=sm,
        sm_occupancy_ratio=None,
        tensor_active_ratio=None,
        dram_active_ratio=dram,
        fp64_active_ratio=None,
        fp32_active_ratio=None,
        fp16_active_ratio=None,
        pcie_tx_bytes_per_second=None,
        pcie_rx_bytes_per_second=None,
        nvlink_tx_bytes_per_second=None,
        nvlink_rx_bytes_per_second=None,
    )


@pytest.mark.parametrize(
    ("interference", "sm", "dram", "verdict"),
    [
        (0.8, 0.9, 0.1, "contended"),  # the SMs are the contended resource
        (0.8, 0.1, 0.7, "contended"),  # memory bandwidth is
        (0.8, 0.1, 0.2, "coarse-only"),  # saturated coarse utilisation, idle SMs and memory
        (0.8, None, None, "unmeasured"),  # no GPM (A100, L40S...): the ratio alone
        (0.2, 0.9, 0.9, "ok"),  # under the alert's threshold whatever the activity
    ],
)
def test_interference_is_judged_by_activity(
    interference: float, sm: float | None, dram: float | None, verdict: str
) -> None:
    assert judged(interference, sm, dram) == verdict


def test_the_agent_publishes_activity_of_shared_gpus_only(
    make_node: Callable[..., GpuNode],
) -> None:
    snapshot = make_node("dgx-h100").snapshot()
    gpus = tuple(replace(g, profiling=_profiling(0.123, 0.871)) for g in snapshot.gpus)
    snapshot = replace(snapshot, gpus=gpus)
    shared_uuid = gpus[2].info.uuid
    published = decode(encode(publish(snapshot, shared={shared_uuid: (0.8, 3)})))
    by_index = {g.index: g for g in published.gpus}
    # One decimal: finer changes would re-patch the node annotation for noise.
    assert (by_index[2].sm_active, by_index[2].dram_active) == (0.1, 0.9)
    assert all(g.sm_active is None and g.dram_active is None for i, g in by_index.items() if i != 2)


@pytest.mark.parametrize("bad", ["0.5", 1.5, -0.1, True])
def test_an_activity_that_is_not_a_ratio_makes_the_annotation_unreadable(bad: object) -> None:
    text = encode(PublishedNode((PublishedGpu(0, "NVIDIA H100 80GB HBM3", interference=0.6),)))
    broken = text.replace('"sw":0', f'"sw":0,"sm":{json.dumps(bad)}')
    assert broken != text
    with pytest.raises(PublishedError, match=r"gpus\.sm"):
        decode(broken)


def test_the_review_counts_coarse_only_gpus_and_shows_activity() -> None:
    gpus = (
        PublishedGpu(0, "NVIDIA H100 80GB HBM3", interference=0.9, sm_active=0.1, dram_active=0.2),
        PublishedGpu(1, "NVIDIA H100 80GB HBM3", interference=0.7, sm_active=0.9, dram_active=0.3),
        PublishedGpu(2, "NVIDIA H100 80GB HBM3", interference=0.6),
    )
    node = Node.from_object(
        {
            "metadata": {
                "name": "h100-a",
                "annotations": {lbl.GPU_STATE_ANNOTATION: encode(PublishedNode(gpus))},
            }
        }
    )
    section = sharing_section([node])
    assert section.data["noisy_gpus"] == 3
    assert section.data["coarse_only_gpus"] == 1
    assert [g["judged"] for g in section.data["gpus"]] == ["coarse-only", "contended", "unmeasured"]
    table = section.tables()[0]
    assert table.rows[0][5:8] == ["10%", "20%", "coarse-only"]
    assert any("time-slice switching, not contention" in n for n in table.notes)
