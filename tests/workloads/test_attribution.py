"""Processes to pods: cgroup parsing and the join with pod-resources, on a simulated node."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.gpu.node import GpuNode
from nodeagent.sim.control import SimControl
from nodeagent.testing.nodes import enable_mig
from nodeagent.workloads import (
    NOT_IN_A_POD,
    CgroupReader,
    CgroupRef,
    PodIndex,
    Workload,
    attribute,
    parse_cgroup,
    usage_by_workload,
)
from nodeagent_exporters.podresources import PodDevice

MIB = 1024 * 1024
UID_A = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
UID_B = "11111111-2222-3333-4444-555555555555"
UID_C = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
CID_A = "a" * 64
CID_B = "b" * 64
CID_C = "c" * 64
U_A = UID_A.replace("-", "_")
U_C = UID_C.replace("-", "_")


def _systemd(uid: str, cid: str, qos: str = "burstable", prefix: str = "cri-containerd") -> str:
    u = uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/{prefix}-{cid}.scope"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            _systemd(UID_A, CID_A),
            CgroupRef(UID_A, CID_A, "containerd"),
            id="v2-systemd-containerd",
        ),
        pytest.param(
            _systemd(UID_B, CID_B, prefix="crio"),
            CgroupRef(UID_B, CID_B, "cri-o"),
            id="v2-systemd-crio",
        ),
        pytest.param(
            _systemd(UID_B, CID_B, prefix="docker"),
            CgroupRef(UID_B, CID_B, "docker"),
            id="v2-systemd-docker",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{U_C}.slice/cri-containerd-{CID_C}.scope",
            CgroupRef(UID_C, CID_C, "containerd"),
            id="v2-systemd-guaranteed",
        ),
        pytest.param(
            f"0::/kubepods/besteffort/pod{UID_A}/{CID_A}",
            CgroupRef(UID_A, CID_A),
            id="v2-cgroupfs-containerd",
        ),
        pytest.param(
            f"0::/kubepods/pod{UID_A}/crio-{CID_A}",
            CgroupRef(UID_A, CID_A, "cri-o"),
            id="v2-cgroupfs-crio-guaranteed",
        ),
        pytest.param(
            "12:pids:/\n"
            f"11:memory:/kubepods/burstable/pod{UID_B}\n"
            f"4:cpu,cpuacct:/kubepods/burstable/pod{UID_B}/{CID_B}\n"
            "1:name=systemd:/\n0::/",
            CgroupRef(UID_B, CID_B),
            id="v1-cgroupfs-docker-container-wins",
        ),
        pytest.param(
            "5:devices:/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{U_A}.slice\n",
            CgroupRef(UID_A),
            id="v1-pod-only",
        ),
        pytest.param(
            f"0::/docker/{'d' * 64}/kubelet.slice/kubelet-kubepods.slice/"
            "kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{U_C}.slice/cri-containerd-{CID_C}.scope",
            CgroupRef(UID_C, CID_C, "containerd"),
            id="kind-node-in-docker",
        ),
        pytest.param("0::/system.slice/nvidia-mps.service", NOT_IN_A_POD, id="host-service"),
        pytest.param(
            "0::/user.slice/user-1000.slice/session-3.scope", NOT_IN_A_POD, id="login-shell"
        ),
        pytest.param("0::/", NOT_IN_A_POD, id="cgroup-namespace-root"),
        pytest.param("garbage", NOT_IN_A_POD, id="garbage"),
    ],
)
def test_parse_cgroup(text: str, expected: CgroupRef) -> None:
    assert parse_cgroup(text) == expected


@dataclass(frozen=True)
class Proc:
    """A process the case starts: where, how much, and its cgroup file (None: unreadable)."""

    name: str
    device: str  # "gpu0", "gpu1", "mig2.0", "mig2.1"
    memory_mib: int
    share: float | None
    cgroup: str | None
    mps: bool = False


@dataclass(frozen=True)
class Case:
    procs: tuple[Proc, ...]
    holders: tuple[tuple[str, str, str, str], ...]  # device, namespace, pod, container
    index: PodIndex | None
    # process name -> (namespace, pod, container, source) or None
    expected: dict[str, tuple[str, str, str, str] | None]
    usage: dict[tuple[str, str], int] | None = None  # (device, pod) -> MiB


INDEX = PodIndex(
    pods={UID_A: ("team-a", "train-a"), UID_B: ("team-b", "infer-b"), UID_C: ("team-c", "nb-c")},
    containers={CID_A: (UID_A, "trainer"), CID_B: (UID_B, "server"), CID_C: (UID_C, "kernel")},
)

# The containers of INDEX, as (namespace, pod, container).
TRAINER = ("team-a", "train-a", "trainer")
SERVER = ("team-b", "infer-b", "server")
KERNEL = ("team-c", "nb-c", "kernel")

CASES = [
    pytest.param(
        Case(
            procs=(
                Proc("a", "gpu0", 4000, 0.5, _systemd(UID_A, CID_A)),
                Proc("a2", "gpu0", 1000, 0.2, _systemd(UID_A, CID_A)),
                Proc("b", "gpu0", 9000, 0.5, f"0::/kubepods/burstable/pod{UID_B}/crio-{CID_B}"),
                Proc("c", "gpu0", 500, 0.1, f"3:memory:/kubepods/besteffort/pod{UID_C}/{CID_C}"),
            ),
            holders=(("gpu0", *TRAINER), ("gpu0", *SERVER), ("gpu0", *KERNEL)),
            index=INDEX,
            expected={
                "a": (*TRAINER, "cgroup"),
                "a2": (*TRAINER, "cgroup"),
                "b": (*SERVER, "cgroup"),
                "c": (*KERNEL, "cgroup"),
            },
            usage={("gpu0", "train-a"): 5000, ("gpu0", "infer-b"): 9000, ("gpu0", "nb-c"): 500},
        ),
        id="three-pods-time-sliced",
    ),
    pytest.param(
        Case(
            procs=(
                Proc("mps-server", "gpu1", 30, 0.0, "0::/system.slice/nvidia-mps.service"),
                Proc("a", "gpu1", 3000, 0.3, _systemd(UID_A, CID_A), mps=True),
                Proc("b", "gpu1", 2000, 0.3, _systemd(UID_B, CID_B), mps=True),
            ),
            holders=(("gpu1", *TRAINER), ("gpu1", *SERVER)),
            index=INDEX,
            expected={
                "mps-server": None,  # a host process: no pod's numbers
                "a": (*TRAINER, "cgroup"),
                "b": (*SERVER, "cgroup"),
            },
            usage={("gpu1", "train-a"): 3000, ("gpu1", "infer-b"): 2000},
        ),
        id="mps-clients-and-server",
    ),
    pytest.param(
        Case(
            procs=(
                Proc("a", "mig2.0", 800, None, None),  # no access to /proc: pod-resources
                Proc("b", "mig2.1", 1200, None, _systemd(UID_B, CID_B)),
            ),
            holders=(("mig2.0", *TRAINER), ("mig2.1", *SERVER)),
            index=INDEX,
            expected={
                "a": (*TRAINER, "pod-resources"),
                "b": (*SERVER, "cgroup"),
            },
            usage={("mig2.0", "train-a"): 800, ("mig2.1", "infer-b"): 1200},
        ),
        id="mig-devices",
    ),
    pytest.param(
        Case(
            procs=(
                Proc("a", "gpu0", 100, 0.1, _systemd(UID_A, CID_A)),
                Proc("b", "gpu1", 100, 0.1, _systemd(UID_B, CID_B)),
            ),
            holders=(("gpu0", *TRAINER), ("gpu0", *SERVER), ("gpu1", *SERVER)),
            index=None,  # no API server: the UID names the pod only where one pod holds it
            expected={
                "a": ("", "", "", "cgroup"),
                "b": (*SERVER, "pod-resources"),
            },
        ),
        id="no-pod-index",
    ),
    pytest.param(
        Case(
            procs=(
                Proc("x", "gpu0", 100, 0.1, None),
                Proc("y", "gpu1", 100, 0.1, "0::/user.slice/user-0.slice/session-1.scope"),
            ),
            holders=(("gpu0", *TRAINER), ("gpu0", *SERVER), ("gpu1", *SERVER)),
            index=INDEX,
            # Unreadable cgroup on a shared GPU: unknowable. A readable host cgroup: not the
            # holder's, even when one pod holds the GPU (someone ran a job outside Kubernetes).
            expected={"x": None, "y": None},
        ),
        id="unknowable-and-outsider",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_attribution(
    case: Case, make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    enable_mig(node, {2: ["3g.40gb", "3g.40gb"]})
    control = SimControl(sim_state_dir)
    migs = [gi.compute_instances[0].uuid for gi in node.mig_instances(2)]
    uuids = {
        "gpu0": node.info(0).uuid,
        "gpu1": node.info(1).uuid,
        "mig2.0": migs[0],
        "mig2.1": migs[1],
    }
    proc_root = tmp_path / "proc"
    pids: dict[str, int] = {}
    for p in case.procs:
        gpu = 2 if p.device.startswith("mig") else int(p.device[3:])
        mig = uuids[p.device] if p.device.startswith("mig") else None
        pid = control.add_process(
            gpu, mig_uuid=mig, used_memory_mib=p.memory_mib, load=p.share, name=p.name, mps=p.mps
        )
        pids[p.name] = pid
        if p.cgroup is not None:
            (proc_root / str(pid)).mkdir(parents=True)
            (proc_root / str(pid) / "cgroup").write_text(p.cgroup + "\n")
    holders = [
        PodDevice("nvidia.com/gpu", uuids[dev], pod, ns, ctr, 1)
        for dev, ns, pod, ctr in case.holders
    ]
    attributed = attribute(node.snapshot(), holders, CgroupReader(proc_root), case.index)
    by_pid = {a.process.pid: a for a in attributed}
    assert set(by_pid) == set(pids.values())
    for name, want in case.expected.items():
        got = by_pid[pids[name]]
        assert got.process.name == name
        assert got.device.uuid == uuids[next(p.device for p in case.procs if p.name == name)]
        if want is None:
            assert got.workload is None, name
            continue
        assert got.workload is not None, name
        w = got.workload
        assert (w.namespace, w.pod, w.container, got.source) == want, name
    if case.usage is not None:
        rows = usage_by_workload(attributed)
        back = {v: k for k, v in uuids.items()}
        assert {
            (back[r.device.uuid], r.workload.pod): r.memory_used_bytes // MIB for r in rows
        } == case.usage


def test_mig_device_carries_profile_and_instance(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    enable_mig(node, {4: ["1g.10gb", "2g.20gb"]})
    gi = node.mig_instances(4)[1]
    SimControl(sim_state_dir).add_process(4, mig_uuid=gi.compute_instances[0].uuid)
    (a,) = attribute(node.snapshot(), [], CgroupReader(tmp_path))
    assert (a.device.gpu_index, a.device.mig_profile, a.device.mig_instance) == (
        4,
        gi.profile,
        gi.instance_id,
    )
    assert a.workload is None


def test_usage_sums_sm_share_and_skips_unnamed(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    control = SimControl(sim_state_dir)
    for _ in range(2):
        pid = control.add_process(6, load=0.2, used_memory_mib=100)
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(_systemd(UID_A, CID_A))
    stranger = control.add_process(6, load=0.2)
    (tmp_path / str(stranger)).mkdir()
    (tmp_path / str(stranger) / "cgroup").write_text(_systemd(UID_C, CID_C))
    index = PodIndex(pods={UID_A: ("ns", "p")}, containers={CID_A: (UID_A, "c")})
    attributed = attribute(node.snapshot(), [], CgroupReader(tmp_path), index)
    (row,) = usage_by_workload(attributed)
    assert row.workload == Workload("ns", "p", "c")
    assert row.processes == 2
    assert row.memory_used_bytes == 200 * MIB
    assert row.sm_share_ratio is not None
    assert 0.3 <= row.sm_share_ratio <= 0.41


def test_reader_caches_per_pid_and_retries_unreadable(tmp_path: Path) -> None:
    reader = CgroupReader(tmp_path)
    assert reader(7) is None
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(_systemd(UID_A, CID_A))
    assert reader(7) == CgroupRef(UID_A, CID_A, "containerd")
    reads = reader.reads
    assert reader(7) is not None
    assert reader.reads == reads  # cached
    reader.retain([])
    reader(7)
    assert reader.reads == reads + 1
