"""Profiling families: from a simulated node's GPM through the renderer, never zeros for
GPUs without GPM."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import Placement
from nodeagent.sim.control import SimControl
from nodeagent.sim.nvml import SimNvml
from nodeagent.testing.clock import FakeClock
from nodeagent.workloads import CgroupReader, PodIndex
from nodeagent_exporters.catalog import MIG_PROFILING, PROFILING
from nodeagent_exporters.render import Renderer, Sources
from tests.exporters.exporter_factories import Samples, gpu_state, parse_samples, snapshot, value
from tests.exporters.profiling_factories import profiling
from tests.exporters.test_render import UID0, UID1, full_node, render


def _families(samples: Samples, prefix: str) -> set[str]:
    return {name for name, _ in samples if name.startswith(prefix)}


def _two_passes(tmp_path: Path, preset: str, mig: bool = False) -> Samples:
    clock = FakeClock()
    sim = SimNvml(tmp_path / preset, preset, clock=clock)
    control = SimControl(tmp_path / preset, clock=clock)
    with GpuNode(sim) as node:
        if mig:
            control.set_mig_mode(0, True)
            busy = node.create_gpu_instance(0, "3g.40gb", Placement(0, 4))
            node.create_gpu_instance(0, "1g.10gb", Placement(4, 1))
            assert busy.uuid is not None
            control.add_process(0, mig_uuid=busy.uuid, load=0.3)
        else:
            control.add_process(0, load=0.6)
        node.snapshot()
        clock.advance(1.0)
        return render(node.snapshot())


@pytest.mark.parametrize("preset", ["dgx-h100", "hgx-h200"])
def test_hopper_gpus_export_every_gpu_family(tmp_path: Path, preset: str) -> None:
    samples = _two_passes(tmp_path, preset)
    want = {f"nodeagent_gpu_prof_{f.suffix}" for f in PROFILING}
    assert _families(samples, "nodeagent_gpu_prof_") == want
    busy = value(samples, "nodeagent_gpu_prof_sm_active_ratio", gpu="0")
    idle = value(samples, "nodeagent_gpu_prof_sm_active_ratio", gpu="1")
    coarse = value(samples, "nodeagent_gpu_utilization_ratio", gpu="0")
    assert busy is not None
    assert coarse is not None
    assert 0.0 < busy < coarse
    assert idle == 0.0
    # One series per GPU of the node.
    assert sum(1 for n, _ in samples if n == "nodeagent_gpu_prof_sm_active_ratio") == 8


@pytest.mark.parametrize("preset", ["dgx-a100", "t4", "pcie-l40s", "a30x4"])
def test_gpus_without_gpm_export_nothing(tmp_path: Path, preset: str) -> None:
    samples = _two_passes(tmp_path, preset)
    assert _families(samples, "nodeagent_gpu_prof_") == set()
    assert _families(samples, "nodeagent_mig_prof_") == set()
    # The coarse figures are still there: only profiling is missing.
    assert value(samples, "nodeagent_gpu_utilization_ratio", gpu="0") is not None


def test_mig_instances_export_their_own_figures(tmp_path: Path) -> None:
    samples = _two_passes(tmp_path, "dgx-h100", mig=True)
    want = {f"nodeagent_mig_prof_{f.suffix}" for f in MIG_PROFILING}
    assert _families(samples, "nodeagent_mig_prof_") == want
    busy = value(samples, "nodeagent_mig_prof_graphics_active_ratio", mig_profile="3g.40gb")
    quiet = value(samples, "nodeagent_mig_prof_graphics_active_ratio", mig_profile="1g.10gb")
    # 0.3 of the GPU on a 3-slice instance of 7 keeps it 0.7 busy (0.8..1.0 of that).
    assert busy is not None
    assert 0.55 <= busy <= 0.71
    assert quiet == 0.0


def test_first_pass_exports_no_profiling(tmp_path: Path) -> None:
    sim = SimNvml(tmp_path / "h", "dgx-h100", clock=FakeClock())
    with GpuNode(sim) as node:
        samples = render(node.snapshot())
    assert _families(samples, "nodeagent_gpu_prof_") == set()


def test_workload_rows_carry_their_device_figures(tmp_path: Path) -> None:
    snap, health, allocations = full_node()
    renderer = Renderer(
        Sources(
            policy=PoolPolicy,
            health=lambda: health,
            allocations=lambda: allocations,
            cgroups=CgroupReader(tmp_path),
            pod_index=lambda: PodIndex({UID0: ("ml", "train-0"), UID1: ("ml", "train-1")}),
        )
    )
    # GPU 3's two processes (PIDs 100, 101) run in two pods.
    for pid, uid in ((100, UID0), (101, UID1)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(f"0::/kubepods/pod{uid}/{'a' * 64}\n")
    samples = parse_samples(renderer.render(snap).body.decode())
    rows = {
        dict(labels)["pod"]: v
        for (name, labels), v in samples.items()
        if name == "nodeagent_workload_gpu_prof_sm_active_ratio"
    }
    # A shared GPU: both pods see GPU 3's device-wide figure.
    device = value(samples, "nodeagent_gpu_prof_sm_active_ratio", gpu="3")
    assert device is not None
    assert rows == {"train-0": device, "train-1": device}


def test_partial_figures_leave_out_only_what_is_missing() -> None:
    gpu = gpu_state(0)
    figures = profiling(0.4, whole_gpu=False)  # no PCIe or NVLink figures
    samples = render(snapshot([replace(gpu, profiling=figures)]))
    assert value(samples, "nodeagent_gpu_prof_sm_active_ratio", gpu="0") == 0.4
    assert value(samples, "nodeagent_gpu_prof_pcie_rx_bytes_per_second", gpu="0") is None
