"""The noisy-neighbour signal of shared devices, from a simulated node."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.gpu.node import GpuNode
from nodeagent.sim.control import SimControl
from nodeagent.testing.nodes import enable_mig
from nodeagent.workloads import CgroupReader, PodIndex, attribute, shared_devices

GIB_MIB = 1024
H100_3G_40GB_MIB = 40448  # a 3g.40gb instance on an H100 80GB HBM3 (lgip: 39.50 GiB)


def _uid(i: int) -> str:
    return f"{i:08x}-0000-0000-0000-000000000000"


INDEX = PodIndex(
    {_uid(i): ("team", f"pod-{i}") for i in range(4)},
    {f"{i:x}" * 64: (_uid(i), "main") for i in range(4)},
)


@dataclass(frozen=True)
class Case:
    shares: tuple[float, ...]  # one pod per share, all on GPU 0
    memory_gib: tuple[int, ...]
    fault: str | None  # a simulator fault on GPU 0
    starvation: tuple[float, float] | None  # (low, high) or None (absent)
    interference: tuple[float, float]
    throttled: bool


CASES = [
    # Room to spare: a small share is the workload's own choice, nobody starves.
    pytest.param(Case((0.2, 0.3), (10, 10), None, (0.0, 0.0), (0.0, 0.0), False), id="quiet"),
    # Saturated: 0.9 and 0.3 asked for, 0.75 and 0.25 given; fair is 0.5, so 0.5 below fair.
    # The driver's samples are whole percents of a moving utilization: a few points either way.
    pytest.param(
        Case((0.9, 0.3), (10, 10), None, (0.45, 0.55), (0.45, 0.55), False), id="saturated"
    ),
    # Four equal pods on a saturated GPU: each gets its fair share.
    pytest.param(Case((0.5,) * 4, (5, 5, 5, 5), None, (0.0, 0.02), (0.0, 0.02), False), id="fair"),
    # 76 of 80 GiB used: pressure 0.95 is 0.75 above the floor.
    pytest.param(
        Case((0.1, 0.1), (40, 36), None, (0.0, 0.0), (0.7, 0.8), False), id="memory-pressure"
    ),
    pytest.param(Case((0.1, 0.1), (1, 1), "thermal", (0.0, 0.0), (1.0, 1.0), True), id="thermal"),
]


def _start(control: SimControl, root: Path, gpu: int, i: int, mig: str | None, **kw) -> None:
    pid = control.add_process(gpu, mig_uuid=mig, **kw)
    (root / str(pid)).mkdir()
    u = _uid(i).replace("-", "_")
    cid = f"{i:x}" * 64
    (root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{cid}.scope\n"
    )


@pytest.mark.parametrize("case", CASES)
def test_shared_gpu_signal(
    case: Case, make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    control = SimControl(sim_state_dir)
    for i, (share, gib) in enumerate(zip(case.shares, case.memory_gib, strict=True)):
        _start(control, tmp_path, 0, i, None, load=share, used_memory_mib=gib * GIB_MIB)
    _start(control, tmp_path, 1, 0, None, load=0.5)  # alone on GPU 1: not shared
    if case.fault is not None:
        control.inject(case.fault, 0)
    snapshot = node.snapshot()
    (shared,) = shared_devices(snapshot, attribute(snapshot, [], CgroupReader(tmp_path), INDEX))
    assert shared.device.gpu_index == 0
    assert len(shared.workloads) == len(case.shares)
    assert shared.fair_share_ratio == pytest.approx(1 / len(case.shares))
    assert shared.throttled is case.throttled
    if case.starvation is None:
        assert shared.starvation_ratio is None
    else:
        assert shared.starvation_ratio is not None
        assert case.starvation[0] <= shared.starvation_ratio <= case.starvation[1]
    assert case.interference[0] <= shared.interference_ratio <= case.interference[1]


def test_mig_device_shared_by_two_pods_has_memory_but_no_time_shares(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    enable_mig(node, {3: ["3g.40gb"]})
    mig = node.mig_instances(3)[0].compute_instances[0].uuid
    control = SimControl(sim_state_dir)
    for i in range(2):
        _start(control, tmp_path, 3, i, mig, used_memory_mib=18 * GIB_MIB)
    snapshot = node.snapshot()
    (shared,) = shared_devices(snapshot, attribute(snapshot, [], CgroupReader(tmp_path), INDEX))
    assert shared.device.mig_uuid == mig
    assert shared.time_shares == {}
    assert shared.starvation_ratio is None
    # The instance's memory (the simulated H100's 3g.40gb), not the whole GPU's 80 GB.
    assert shared.memory_total_bytes == H100_3G_40GB_MIB * 1024 * 1024
    assert shared.memory_pressure_ratio == pytest.approx(36 * GIB_MIB / H100_3G_40GB_MIB)
