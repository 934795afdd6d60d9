"""Per-workload series from a simulated node: pods sharing a GPU, the cap, host processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.gpu.node import GpuNode
from nodeagent.sim.control import SimControl
from nodeagent.workloads import CgroupReader, PodIndex
from nodeagent_exporters.podresources import Allocations, PodDevice
from nodeagent_exporters.render import Renderer, Sources
from tests.exporters.exporter_factories import parse_samples, value

MIB = 1024 * 1024
PODS = {
    f"{i:08x}-0000-0000-0000-000000000000": ("team", f"pod-{i}", f"{i:x}" * 64) for i in range(3)
}


def _cgroup(uid: str, cid: str) -> str:
    u = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{cid}.scope\n"


def _render(node: GpuNode, proc_root: Path, holders: tuple[PodDevice, ...], cap: int = 1000):
    index = PodIndex(
        {uid: (ns, pod) for uid, (ns, pod, _) in PODS.items()},
        {cid[:64]: (uid, "main") for uid, (_, _, cid) in PODS.items()},
    )
    renderer = Renderer(
        Sources(
            policy=PoolPolicy,
            allocations=lambda: Allocations(0.0, True, {}, {}, holders),
            cgroups=CgroupReader(proc_root),
            pod_index=lambda: index,
            max_workload_series=cap,
        )
    )
    return renderer, parse_samples(renderer.render(node.snapshot()).body.decode())


def test_pods_on_a_time_sliced_gpu_each_get_their_numbers(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    control = SimControl(sim_state_dir)
    uuid = node.info(0).uuid
    memory = {"pod-0": 1000, "pod-1": 3000, "pod-2": 500}
    for uid, (_, pod, cid) in PODS.items():
        pid = control.add_process(0, used_memory_mib=memory[pod], load=0.3)
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(_cgroup(uid, cid[:64]))
    server = control.add_process(0, used_memory_mib=25, load=0.0, name="nvidia-cuda-mps-server")
    (tmp_path / str(server)).mkdir()
    (tmp_path / str(server) / "cgroup").write_text("0::/system.slice/nvidia-mps.service\n")
    holders = tuple(
        PodDevice("nvidia.com/gpu", uuid, pod, "team", "main", 1) for _, pod, _ in PODS.values()
    )
    renderer, samples = _render(node, tmp_path, holders)
    mem = "nodeagent_workload_gpu_memory_used_bytes"
    for pod, mib in memory.items():
        assert value(samples, mem, pod=pod, gpu="0", uuid=uuid, mig_profile="") == mib * MIB
        share = value(samples, "nodeagent_workload_gpu_sm_share_ratio", pod=pod)
        assert share is not None
        assert 0.2 <= share <= 0.31
        assert value(samples, "nodeagent_workload_gpu_processes", pod=pod) == 1
    assert value(samples, "nodeagent_gpu_unattributed_memory_used_bytes", gpu="0") == 25 * MIB
    assert value(samples, "nodeagent_gpu_unattributed_memory_used_bytes", gpu="1") == 0
    assert value(samples, "nodeagent_workload_series_dropped") == 0
    assert {p.workload.pod for p in renderer.processes if p.workload is not None} == set(memory)

    # Capped at 2 series: the biggest memory users stay, the drop is counted.
    _, capped = _render(node, tmp_path, holders, cap=2)
    kept = {dict(labels)["pod"] for name, labels in capped if name == mem}
    assert kept == {"pod-0", "pod-1"}
    assert value(capped, "nodeagent_workload_series_dropped") == 1
