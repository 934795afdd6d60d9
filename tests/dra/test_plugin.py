"""The DRA kubelet plugin over real unix sockets, driven by the test kubelet."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.config.device_plugin import MpsSection
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import Placement
from nodeagent.runtime.lock import ProcessLock
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl
from nodeagent.testing.drakubelet import OLDER, DraConnection, Prepared, TestDraKubelet
from nodeagent.testing.mps_control import daemon_pid, running
from nodeagent.testing.nodes import enable_mig
from nodeagent.testing.waiting import wait_until
from nodeagent_dra.checkpoint import Checkpoint, checkpoint_path
from nodeagent_dra.component import DraComponent
from tests.dra.plugin_support import DRIVER, NODE, Claims, claim_json, make_driver, serve
from tests.dra.test_publisher import agent_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def claims() -> Claims:
    return Claims()


@pytest.fixture
def h100(make_node: Callable[..., GpuNode]) -> GpuNode:
    node = make_node("dgx-h100")
    enable_mig(node, {0: [], 1: []})
    return node


@pytest.fixture
def plugin(h100: GpuNode, tmp_path: Path, claims: Claims) -> Iterator[tuple]:
    driver = make_driver(h100, tmp_path, claims)
    server = serve(driver, tmp_path)
    kubelet = TestDraKubelet(tmp_path / "plugins_registry")
    connection = kubelet.register()
    yield driver, server, connection
    kubelet.close()
    server.stop()


def prepared(connection: DraConnection, ref: tuple[str, str, str]) -> Prepared:
    """The kubelet's NodePrepareResources of the one claim ``ref``, which must succeed."""
    answer = connection.prepare([ref])[ref[1]]
    assert answer.error == ""
    return answer


def instances(node: GpuNode, gpu: int) -> list[str]:
    return [gi.slot.label for gi in node.mig_instances(gpu)]


def test_registration_names_the_driver_its_socket_and_both_services(
    plugin: tuple, tmp_path: Path
) -> None:
    _, server, connection = plugin
    assert connection.info.type == "DRAPlugin"
    assert connection.info.name == DRIVER
    assert connection.info.endpoint == str(tmp_path / "plugins" / DRIVER / "dra.sock")
    assert list(connection.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert connection.version == "v1.DRAPlugin"
    assert server.registered.wait(2)


def test_an_older_kubelet_speaks_v1beta1_and_a_refusal_is_recorded(
    t4: GpuNode, tmp_path: Path, claims: Claims
) -> None:
    server = serve(make_driver(t4, tmp_path, claims, dynamic_mig=False), tmp_path)
    try:
        older = TestDraKubelet(tmp_path / "plugins_registry", versions=OLDER)
        connection = older.register()
        assert connection.version == "v1beta1.DRAPlugin"
        ref = claims.add(claim_json("c", [("gpu", "gpu-0")]))
        answer = prepared(connection, ref)
        assert [d["device"] for d in answer.devices] == ["gpu-0"]
        older.close()
        with pytest.raises(PermissionError):
            TestDraKubelet(tmp_path / "plugins_registry").register(reject="driver name taken")
        assert not server.registered.is_set()
        assert server.registration_error == "driver name taken"
    finally:
        server.stop()
    assert not list((tmp_path / "plugins_registry").glob("*.sock")), "sockets removed at stop"


@pytest.fixture
def t4(make_node: Callable[..., GpuNode]) -> GpuNode:
    return make_node("t4")


def test_a_whole_gpu_gets_a_cdi_spec_and_prepare_is_idempotent(
    t4: GpuNode, tmp_path: Path, claims: Claims
) -> None:
    server = serve(make_driver(t4, tmp_path, claims, dynamic_mig=False), tmp_path)
    kubelet = TestDraKubelet(tmp_path / "plugins_registry")
    try:
        connection = kubelet.register()
        ref = claims.add(claim_json("train", [("gpu", "gpu-0")]))
        first = connection.prepare([ref])[ref[1]]
        uid = ref[1]
        assert first.error == ""
        assert first.devices == [
            {
                "requests": ["gpu"],
                "pool": NODE,
                "device": "gpu-0",
                "cdi": [f"k8s.{DRIVER}/claim={uid}-gpu-0"],
            }
        ]
        spec_file = tmp_path / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json"
        spec = json.loads(spec_file.read_text())
        assert spec["kind"] == f"k8s.{DRIVER}/claim"
        (device,) = spec["devices"]
        assert device["name"] == f"{uid}-gpu-0"
        assert f"NVIDIA_VISIBLE_DEVICES={t4.info(0).uuid}" in device["containerEdits"]["env"]
        assert {"path": "/dev/nvidia0"} in device["containerEdits"]["deviceNodes"]
        # The claim is gone from the API server: a second prepare answers from the checkpoint.
        claims.items.clear()
        again = connection.prepare([ref])[uid]
        assert again == first
        assert connection.unprepare([ref]) == {uid: ""}
        assert not spec_file.exists()
        assert connection.unprepare([ref]) == {uid: ""}, "unprepare is idempotent"
    finally:
        kubelet.close()
        server.stop()


def test_dynamic_mig_creates_exactly_the_allocated_placement_and_destroys_it_when_idle(
    plugin: tuple, h100: GpuNode, claims: Claims, sim_state_dir: Path
) -> None:
    driver, _, connection = plugin
    ref = claims.add(claim_json("inf", [("mig", "gpu-1-mig-3g40gb-9-4")]))
    prepared(connection, ref)
    assert instances(h100, 1) == ["3g.40gb@4:4"]
    assert driver.managed() == {(1, "3g.40gb", 4)}
    mig_uuid = h100.mig_instances(1)[0].uuid
    spec = json.loads(next((driver.cdi.spec_dir).glob("*.json")).read_text())
    assert f"NVIDIA_VISIBLE_DEVICES={mig_uuid}" in spec["devices"][0]["containerEdits"]["env"]
    # Busy: a process runs on the instance. Unprepare refuses and keeps the claim.
    control = SimControl(sim_state_dir)
    pid = control.add_process(1, mig_uuid=mig_uuid)
    error = connection.unprepare([ref])[ref[1]]
    assert "still runs processes" in error
    assert instances(h100, 1) == ["3g.40gb@4:4"]
    assert ref[1] in driver.checkpoint.claims
    control.remove_process(pid)
    assert connection.unprepare([ref]) == {ref[1]: ""}
    assert instances(h100, 1) == []
    assert driver.managed() == frozenset()


def test_each_claim_gets_its_own_error(plugin: tuple, h100: GpuNode, claims: Claims) -> None:
    _, _, connection = plugin
    good = claims.add(claim_json("good", [("a", "gpu-0-mig-1g10gb-19-0")]))
    bad_name = claims.add(claim_json("bad", [("a", "gpu-0-mig-9g99gb-99-0")]))
    missing = ("team-a", "0000-uid", "never-created")
    overlap = claims.add(claim_json("overlap", [("a", "gpu-0-mig-2g20gb-14-0")]))
    answers = connection.prepare([good, bad_name, missing, overlap])
    assert set(answers) == {good[1], bad_name[1], missing[1], overlap[1]}
    assert answers[good[1]].error == ""
    assert answers[bad_name[1]].error == (
        "device 'gpu-0-mig-9g99gb-99-0' is not one this node publishes "
        f"(driver {DRIVER}, pool {NODE})"
    )
    assert "not found" in answers[missing[1]].error
    assert "cannot create gpu-0-mig-2g20gb-14-0" in answers[overlap[1]].error
    assert instances(h100, 0) == ["1g.10gb@0:1"], "the failed claim left nothing behind"


def test_a_placement_prepared_for_one_claim_is_refused_to_another(
    plugin: tuple, h100: GpuNode, claims: Claims
) -> None:
    _, _, connection = plugin
    a = claims.add(claim_json("a", [("r", "gpu-0-mig-1g10gb-19-3")]))
    b = claims.add(claim_json("b", [("r", "gpu-0-mig-1g10gb-19-3")]))
    assert connection.prepare([a])[a[1]].error == ""
    error = connection.prepare([b])[b[1]].error
    assert "prepared for claim team-a/a already" in error
    assert connection.unprepare([b]) == {b[1]: ""}
    assert instances(h100, 0) == ["1g.10gb@3:1"], "b's unprepare touched nothing of a's"


def test_static_instances_are_served_but_never_destroyed(
    plugin: tuple, h100: GpuNode, claims: Claims
) -> None:
    _, _, connection = plugin
    h100.create_gpu_instance(0, "4g.40gb", Placement(0, 4))
    ref = claims.add(claim_json("s", [("r", "gpu-0-mig-4g40gb-5-0")]))
    assert connection.prepare([ref])[ref[1]].error == ""
    assert connection.unprepare([ref]) == {ref[1]: ""}
    assert instances(h100, 0) == ["4g.40gb@0:4"]


def test_prepare_waits_for_the_mig_lock_and_fails_its_claim_when_held(
    h100: GpuNode, tmp_path: Path, claims: Claims
) -> None:
    driver = make_driver(h100, tmp_path, claims, lock_timeout_s=0.3)
    held = ProcessLock(tmp_path / "mig.lock", "the node's MIG layout")
    held.acquire()
    try:
        ref = claims.add(claim_json("c", [("r", "gpu-0-mig-1g10gb-19-0")]))
        outcome = driver.prepare([ClaimRefOf(ref)])[ref[1]]
        assert "MIG layout busy" in outcome.error
        assert instances(h100, 0) == []
    finally:
        held.release()
    assert driver.prepare([ClaimRefOf(ref)])[ref[1]].error == ""


def ClaimRefOf(ref: tuple[str, str, str]):
    from nodeagent_dra.driver import ClaimRef

    return ClaimRef(*ref)


_CRASHING_PLUGIN = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from nodeagent.agent.backend import open_node
from tests.dra.plugin_support import Claims, claim_json, make_driver
from nodeagent_dra.driver import ClaimRef

node = open_node(simulate="dgx-h100", state_dir=Path({sim!r}))
real_create = node.create_gpu_instance

def create_then_die(*args, **kwargs):
    real_create(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)  # after NVML made it, before the checkpoint knows

node.create_gpu_instance = create_then_die
claims = Claims()
claims.add(claim_json("c", [("r", "gpu-0-mig-2g20gb-14-2")], uid="uid-1"))
make_driver(node, Path({root!r}), claims).prepare([ClaimRef("team-a", "uid-1", "c")])
"""


def test_a_kill_between_create_and_checkpoint_is_adopted_on_restart(
    h100: GpuNode, tmp_path: Path, sim_state_dir: Path, claims: Claims
) -> None:
    script = textwrap.dedent(
        _CRASHING_PLUGIN.format(repo=str(REPO), sim=str(sim_state_dir), root=str(tmp_path))
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert instances(h100, 0) == ["2g.20gb@2:2"], "the instance exists"
    record = Checkpoint.load(checkpoint_path(tmp_path / "state")).claims["uid-1"]
    assert not record.prepared
    assert record.devices[0].mig is not None
    assert record.devices[0].mig.instance_id is None
    # The restarted plugin: the kubelet retries the prepare.
    claims.add(claim_json("c", [("r", "gpu-0-mig-2g20gb-14-2")], uid="uid-1"))
    driver = make_driver(h100, tmp_path, claims)
    outcome = driver.prepare([ClaimRefOf(("team-a", "uid-1", "c"))])["uid-1"]
    assert outcome.error == ""
    assert instances(h100, 0) == ["2g.20gb@2:2"], "adopted, not created twice"
    mig = driver.checkpoint.claims["uid-1"].devices[0].mig
    assert mig is not None
    assert mig.instance_id == h100.mig_instances(0)[0].instance_id
    assert driver.unprepare([ClaimRefOf(("team-a", "uid-1", "c"))]) == {"uid-1": ""}
    assert instances(h100, 0) == []
    assert os.path.exists(checkpoint_path(tmp_path / "state"))


def _gpu_config(
    sharing: dict, requests: list[str] | None = None, api: str = "resource.nodeagent.io/v1beta1"
) -> dict:
    entry = {
        "source": "FromClaim",
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": api, "kind": "MigDeviceConfig", "sharing": sharing},
        },
    }
    if requests is not None:
        entry["requests"] = requests
    return entry


MPS_LIMITS = {
    "strategy": "MPS",
    "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
}


def mps_section(mps_dir: Path, binary: Path | None = None) -> MpsSection:
    return MpsSection(
        root=mps_dir / "mps",
        control_binary=binary or mps_dir / "nvidia-cuda-mps-control",
        start_timeout_s=5.0,
        check_interval_s=0.1,
    )


def test_an_mps_claim_runs_its_daemon_with_the_claims_limits_while_prepared(
    h100: GpuNode, tmp_path: Path, claims: Claims, mps_dir: Path
) -> None:
    driver = make_driver(h100, tmp_path, claims, mps=mps_section(mps_dir))
    server = serve(driver, tmp_path)
    kubelet = TestDraKubelet(tmp_path / "plugins_registry")
    try:
        connection = kubelet.register()
        ref = claims.add(
            claim_json(
                "shared", [("mig", "gpu-0-mig-3g40gb-9-4")], config=[_gpu_config(MPS_LIMITS)]
            )
        )
        prepared(connection, ref)
        assert instances(h100, 0) == ["3g.40gb@4:4"], "MPS together with dynamic MIG"
        uuid = h100.mig_instances(0)[0].uuid
        assert uuid is not None
        pipe, log_dir = mps_dir / "mps" / uuid / "pipe", mps_dir / "mps" / uuid / "log"
        pid = daemon_pid(pipe)
        assert running(pid)
        control_log = (log_dir / "control.log").read_text().splitlines()
        assert "set_default_active_thread_percentage 50" in control_log
        assert "set_default_device_pinned_mem_limit 0 10240M" in control_log
        edits = json.loads(driver.cdi.spec_path(ref[1]).read_text())["devices"][0]["containerEdits"]
        assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in edits["env"]
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in edits["env"]
        assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}=10240M" in edits["env"]
        assert edits["mounts"][0]["hostPath"] == str(pipe)
        assert connection.unprepare([ref]) == {ref[1]: ""}
        assert wait_until(lambda: not running(pid)), "the last claim on the device is gone"
        assert driver.mps.daemon(uuid) is None
    finally:
        kubelet.close()
        server.stop()


def test_mps_daemons_of_prepared_claims_survive_a_restart_and_are_restarted_when_dead(
    h100: GpuNode, tmp_path: Path, claims: Claims, mps_dir: Path
) -> None:
    first = make_driver(h100, tmp_path, claims, mps=mps_section(mps_dir))
    ref = claims.add(claim_json("shared", [("gpu", "gpu-2")], config=[_gpu_config(MPS_LIMITS)]))
    assert first.prepare([ClaimRefOf(ref)])[ref[1]].error == ""
    gpu = h100.info(2).uuid  # MIG off: the daemon serves the whole GPU
    pipe = mps_dir / "mps" / gpu / "pipe"
    pid = daemon_pid(pipe)
    # The agent restarts: a new driver from the same checkpoint adopts the running daemon.
    second = make_driver(h100, tmp_path, claims, mps=mps_section(mps_dir))
    second.restore_mps()
    daemon = second.mps.daemon(gpu)
    assert daemon is not None
    assert daemon.ready
    assert daemon.starts == 0, "adopted, not started twice"
    assert daemon_pid(pipe) == pid
    # The daemon dies while the claim is prepared: the next check starts it again.
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not running(pid))
    assert wait_until(lambda: second.check_mps() and daemon.ready, timeout_s=5)
    assert daemon_pid(pipe) != pid
    assert daemon.starts == 1
    # Dead while the agent was away: the restarted agent starts it from the checkpoint.
    pid = daemon_pid(pipe)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not running(pid))
    third = make_driver(h100, tmp_path, claims, mps=mps_section(mps_dir))
    third.restore_mps()
    assert third.mps.ready(gpu)
    pid = daemon_pid(pipe)
    assert third.unprepare([ClaimRefOf(ref)]) == {ref[1]: ""}
    assert wait_until(lambda: not running(pid))


def test_the_agent_restores_mps_daemons_before_serving_and_leaves_them_running_at_stop(
    h100: GpuNode, tmp_path: Path, claims: Claims, mps_dir: Path
) -> None:
    config = agent_config(tmp_path, NODE, mps_dir=mps_dir)

    def component() -> DraComponent:
        made = DraComponent(config, h100, SnapshotStore(), None, mig_lock_file=tmp_path / "lock")
        made.driver.claims = claims
        made.refresh(h100.snapshot())  # a node prepares only what it published
        return made

    ref = claims.add(claim_json("shared", [("gpu", "gpu-2")], config=[_gpu_config(MPS_LIMITS)]))
    assert component().driver.prepare([ClaimRefOf(ref)])[ref[1]].error == ""
    gpu = h100.info(2).uuid
    pipe = config.dra.mps_root / gpu / "pipe"
    pid = daemon_pid(pipe)
    os.kill(pid, signal.SIGKILL)  # the agent and its daemon went down together
    assert wait_until(lambda: not running(pid))
    restarted = component()
    stop = threading.Event()
    thread = threading.Thread(target=restarted.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: restarted.ready, timeout_s=10)
        assert restarted.driver.mps.ready(gpu), "started again before the kubelet is served"
        again = daemon_pid(pipe)
        assert again != pid
        assert running(again)
    finally:
        stop.set()
        restarted.wake.set()
        thread.join(10)
    assert running(again), "stopping the agent leaves the claim's daemon to its containers"
    assert restarted.driver.unprepare([ClaimRefOf(ref)]) == {ref[1]: ""}
    assert wait_until(lambda: not running(again))


def test_an_mps_daemon_that_cannot_start_fails_only_its_claim(
    h100: GpuNode, tmp_path: Path, claims: Claims, mps_dir: Path
) -> None:
    section = mps_section(mps_dir, binary=mps_dir / "no-such-mps-control")
    driver = make_driver(h100, tmp_path, claims, mps=section)
    mps = claims.add(claim_json("mps", [("gpu", "gpu-2")], config=[_gpu_config(MPS_LIMITS)]))
    plain = claims.add(claim_json("plain", [("gpu", "gpu-3")]))
    out = driver.prepare([ClaimRefOf(mps), ClaimRefOf(plain)])
    assert out[plain[1]].error == ""
    error = out[mps[1]].error
    assert error.startswith("claim team-a/mps: MPS control daemon did not start (gpu-2: ")
    assert "no-such-mps-control" in error
    assert not driver.cdi.spec_path(mps[1]).exists()
    assert mps[1] not in driver.checkpoint.claims
    assert driver.mps.daemon(h100.info(2).uuid) is None, "no daemon left retrying"


def test_time_slicing_and_nvidias_parameter_group_are_read_and_bad_ones_fail_their_claim(
    plugin: tuple, claims: Claims
) -> None:
    driver, _, connection = plugin
    sliced = claims.add(
        claim_json(
            "sliced",
            [("mig", "gpu-1-mig-1g10gb-19-0")],
            config=[
                _gpu_config(
                    {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
                    api="resource.nvidia.com/v1beta1",
                )
            ],
        )
    )
    bad = claims.add(
        claim_json(
            "bad", [("mig", "gpu-1-mig-1g10gb-19-1")], config=[_gpu_config({"strategy": "Magic"})]
        )
    )
    other = claims.add(
        claim_json(
            "other-driver",
            [("mig", "gpu-1-mig-1g10gb-19-2")],
            config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "?"}}}],
        )
    )
    answers = connection.prepare([sliced, bad, other])
    assert answers[sliced[1]].error == ""
    env = json.loads(driver.cdi.spec_path(sliced[1]).read_text())["devices"][0]["containerEdits"]
    assert "NODEAGENT_SHARING=TimeSlicing" in env["env"]
    assert "sharing strategy 'Magic'" in answers[bad[1]].error
    assert answers[other[1]].error == "", "another driver's parameters are not ours to judge"


def test_the_whole_gpu_of_a_dynamic_mig_gpu_is_its_largest_instance(
    plugin: tuple, h100: GpuNode, claims: Claims
) -> None:
    _, _, connection = plugin
    whole = claims.add(claim_json("whole", [("gpu", "gpu-1")]))
    prepared(connection, whole)
    assert instances(h100, 1) == ["7g.80gb@0:8"]
    assert connection.unprepare([whole]) == {whole[1]: ""}
    assert instances(h100, 1) == []
