"""An instance a workload holds is busy: `mig apply`, the reconciler and `mig plan` refuse to
destroy it, naming the claim or pod, and only --force (mig.force) goes past, marking the
claim failed (issue 32, item 2).

The workloads are real: claims prepared by the DRA driver on the simulated node (its own
checkpoint, where the agent keeps it), pods served by a pod-resources API on a unix socket, and
a kubelet device-manager checkpoint in the real kubelet's JSON format.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from nodeagent.cli.mig import app
from nodeagent.config.schema import load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.holds import CLAIM, HoldSources
from nodeagent.holds.dra_checkpoint import checkpoint_path, read_claims
from nodeagent.kubelet.allocations import KUBELET_CHECKPOINT
from nodeagent.runtime.lock import ProcessLock
from nodeagent.testing.nodes import enable_mig
from nodeagent.testing.podresources import serving
from nodeagent_dra.driver import ClaimRef, Driver
from nodeagent_dra.slices import SliceSpec, build_slices
from nodeagent_mig.reconciler import MigReconciler
from tests.dra.plugin_support import DRIVER, NODE, Claims, claim_json, make_driver

PRESET = "dgx-h100"
CLAIMED = "gpu-7-mig-3g40gb-9-4"  # the device: a dynamic 3g.40gb at slice 4 of GPU 7
ISOLATED = (
    "NODEAGENT_CONFIG",
    "NODEAGENT_MIG_CONFIG",
    "NODEAGENT_MIG_CONFIG_FILE",
    "NODEAGENT_MIG_STATE_DIR",
    "NODEAGENT_SIMULATE",
    "NODEAGENT_SIM_STATE",
)


@pytest.fixture
def node(make_node: Callable[..., GpuNode]) -> GpuNode:
    """A DGX H100 with MIG on and no instance on any GPU (a dynamic-MIG DRA pool)."""
    gpus = make_node(PRESET)
    enable_mig(gpus, {i: [] for i in range(gpus.count())})
    return gpus


@pytest.fixture
def driver(node: GpuNode, sim_state_dir: Path, tmp_path: Path) -> Driver:
    """The DRA driver of the agent that `nodeagent run --simulate` would run on this node: its
    state (the checkpoint) under ``<sim state>/agent``, where `mig apply` looks for it."""
    return make_driver(node, tmp_path / "dra", Claims(), state_dir=sim_state_dir / "agent")


def prepare(driver: Driver, name: str, device: str = CLAIMED) -> str:
    """Prepare a claim on ``device``; its UID."""
    claims: Claims = driver.claims  # type: ignore[assignment]
    namespace, uid, claim = claims.add(claim_json(name, [("gpu", device)]))
    answer = driver.prepare([ClaimRef(namespace, uid, claim)])[uid]
    assert answer.error == "", answer.error
    return uid


def mig_apply(sim_state_dir: Path, *args: str) -> Result:
    clean: dict[str, str | None] = dict.fromkeys(ISOLATED)
    base = ["--simulate", PRESET, "--state-dir", str(sim_state_dir)]
    return CliRunner().invoke(app, ["apply", *args, *base], env=clean)


def layout(node: GpuNode, index: int) -> list[str]:
    return sorted(g.slot.label for g in node.mig_instances(index))


def claim_instance(node: GpuNode) -> str | None:
    return next((g.uuid for g in node.mig_instances(7) if g.placement.start == 4), None)


@pytest.mark.parametrize("target", ["all-1g.10gb", "all-enabled"])
def test_apply_refuses_to_destroy_an_instance_a_prepared_claim_holds(
    node: GpuNode, driver: Driver, sim_state_dir: Path, target: str
) -> None:
    uid = prepare(driver, "train")
    held = claim_instance(node)
    assert held is not None

    result = mig_apply(sim_state_dir, "-c", target, "--yes", "--allow-reset")

    assert result.exit_code == 1, result.output  # as for an instance with running processes
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("GPU 7: ")]
    assert line == (
        "GPU 7: blocked-busy: the target needs the slices of busy instance(s) 3g.40gb@4:4 "
        "(held by DRA claim team-a/train); every valid layout destroys them"
    )
    assert claim_instance(node) == held, "the claim's instance was destroyed"
    assert all(layout(node, i) == [] for i in range(7)), "a blocked apply changes nothing"
    record = read_claims(checkpoint_path(sim_state_dir / "agent"))[uid]
    assert record.prepared
    assert record.failed == ""


def test_apply_keeps_a_held_instance_when_the_layout_has_room_for_it(
    node: GpuNode, driver: Driver, sim_state_dir: Path
) -> None:
    prepare(driver, "train")
    held = claim_instance(node)

    # all-balanced has a 3g.40gb, and slice 4 is one of its two placements: it stays.
    result = mig_apply(sim_state_dir, "-c", "all-balanced", "--yes")

    assert result.exit_code == 0, result.output
    assert claim_instance(node) == held
    assert "3g.40gb@4:4" in layout(node, 7)


def test_force_destroys_it_and_marks_the_claim_failed(
    node: GpuNode, driver: Driver, sim_state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uid = prepare(driver, "train")
    other = prepare(driver, "other", "gpu-6-mig-3g40gb-9-4")  # on a GPU the layout keeps
    caplog.set_level(logging.WARNING)

    result = mig_apply(
        sim_state_dir, "-f", str(_one_gpu_layout(sim_state_dir)), "-c", "gpu7-1g", "--yes",
        "--force",
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert layout(node, 7) == [f"1g.10gb@{s}:1" for s in range(7)]
    assert "--force took 3g.40gb@4:4: DRA claim team-a/train marked failed" in result.output
    claims = read_claims(checkpoint_path(sim_state_dir / "agent"))
    assert "mig apply --force destroyed 3g.40gb@4:4 on GPU 7" in claims[uid].failed
    assert claims[other].failed == "", "a claim whose instance stayed is not failed"
    assert "DRA claim team-a/train marked failed" in caplog.text
    # The failed claim holds nothing now: only the other claim is read as a holder.
    holds = HoldSources.of_agent(sim_state_dir / "agent", None, None).read()
    assert {c.holder.uid for c in holds.claims} == {other}
    # The driver learns the mark at its next write (it writes the whole file from memory).
    driver.checkpoint.put(driver.checkpoint.claims[other])
    assert driver.checkpoint.claims[uid].failed


def _one_gpu_layout(tmp: Path) -> Path:
    path = tmp / "gpu7.yaml"
    path.write_text(
        "version: v1\nmig-configs:\n  gpu7-1g:\n    - devices: [7]\n      mig-enabled: true\n"
        '      mig-devices: {"1g.10gb": 7}\n'
    )
    return path


def test_a_claim_on_an_instance_the_layout_made_holds_it_too(
    node: GpuNode, driver: Driver, sim_state_dir: Path, tmp_path: Path
) -> None:
    """The plugin made nothing for this claim (it takes the 3g.40gb `mig apply` made), so only
    the device name says which instance it holds; it records it under the MIG lock."""
    assert mig_apply(sim_state_dir, "-c", "all-balanced", "--yes").exit_code == 0
    made = claim_instance(node)
    assert made is not None
    held = ProcessLock(tmp_path / "dra" / "mig.lock", "the node's MIG layout")
    held.acquire()
    try:  # an apply holds the lock: the claim waits for it, and says so when it gives up
        claims: Claims = driver.claims  # type: ignore[assignment]
        ns, uid, name = claims.add(claim_json("early", [("gpu", CLAIMED)]))
        driver.lock_timeout_s = 0.2
        error = driver.prepare([ClaimRef(ns, uid, name)])[uid].error
        assert error.startswith("MIG layout busy: "), error
    finally:
        held.release()
    uid = prepare(driver, "adopter")
    record = read_claims(checkpoint_path(sim_state_dir / "agent"))[uid]
    assert [(d.device, d.mig) for d in record.devices] == [(CLAIMED, None)]

    result = mig_apply(sim_state_dir, "-c", "all-1g.10gb", "--yes")

    assert result.exit_code == 1, result.output
    assert "3g.40gb@4:4 (held by DRA claim team-a/adopter)" in result.output
    assert claim_instance(node) == made


def test_plan_shows_the_holder(node: GpuNode, driver: Driver, sim_state_dir: Path) -> None:
    prepare(driver, "train")
    clean: dict[str, str | None] = dict.fromkeys(ISOLATED)
    result = CliRunner().invoke(
        app,
        ["plan", "-c", "all-1g.10gb", "--simulate", PRESET, "--state-dir", str(sim_state_dir)],
        env=clean,
    )
    assert result.exit_code == 1, result.output
    assert "(held by DRA claim team-a/train)" in result.output


# --- device-plugin allocations ---------------------------------------------------------------


@pytest.fixture
def balanced(node: GpuNode, sim_state_dir: Path) -> str:
    """GPU 3 in all-balanced; the UUID of its 3g.40gb (what the device plugin advertises)."""
    result = mig_apply(sim_state_dir, "-c", "all-balanced", "--yes")
    assert result.exit_code == 0, result.output
    return next(g.uuid for g in node.mig_instances(3) if g.profile == "3g.40gb" and g.uuid)


@pytest.fixture
def kubelet_dirs(short_dir: Path) -> tuple[Path, Path]:
    """(pod-resources socket, device-plugin directory), both empty."""
    plugins = short_dir / "device-plugins"
    plugins.mkdir()
    return short_dir / "pr.sock", plugins


def test_a_pod_holding_the_instance_through_pod_resources_blocks_the_apply(
    node: GpuNode, balanced: str, sim_state_dir: Path, kubelet_dirs: tuple[Path, Path]
) -> None:
    socket, plugins = kubelet_dirs
    with serving(socket) as kubelet:
        kubelet.pods = [("infer-0", "team-b", "main", "nvidia.com/mig-3g.40gb", [balanced])]
        args = ["--pod-resources-socket", str(socket), "--kubelet-dir", str(plugins)]
        result = mig_apply(sim_state_dir, "-c", "all-1g.10gb", "--yes", *args)
        assert result.exit_code == 1, result.output
        assert (
            "GPU 3: blocked-busy: the target needs the slices of busy instance(s) 3g.40gb@4:4 "
            "(held by pod team-b/infer-0 (container main))"
        ) in result.output
        assert balanced in {g.uuid for g in node.mig_instances(3)}

        forced = mig_apply(sim_state_dir, "-c", "all-1g.10gb", "--yes", "--force", *args)
        assert forced.exit_code == 0, forced.output
        assert "--force took 3g.40gb@4:4: pod team-b/infer-0 (container main) lost" in (
            forced.output
        )
        assert balanced not in {g.uuid for g in node.mig_instances(3)}


def test_a_pod_holding_a_whole_gpu_blocks_turning_mig_on_there(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, kubelet_dirs: tuple[Path, Path]
) -> None:
    gpus = make_node(PRESET)  # MIG off everywhere, as the preset comes
    gpu2 = gpus.info(2).uuid
    socket, plugins = kubelet_dirs
    with serving(socket) as kubelet:
        kubelet.pods = [("train-0", "team-c", "main", "nvidia.com/gpu", [f"{gpu2}::1"])]
        args = ["--pod-resources-socket", str(socket), "--kubelet-dir", str(plugins)]
        result = mig_apply(sim_state_dir, "-c", "all-1g.10gb", "--yes", "--allow-reset", *args)
        assert result.exit_code == 1, result.output
        assert (
            "GPU 2: blocked-busy: enabling MIG takes GPU 2 from pod team-c/train-0 (container main)"
        ) in result.output
        assert not any(gpus.info(i).mig_enabled for i in range(gpus.count()))

        forced = mig_apply(
            sim_state_dir, "-c", "all-1g.10gb", "--yes", "--allow-reset", "--force", *args
        )
        assert forced.exit_code == 0, forced.output
        assert "--force took GPU 2: pod team-c/train-0 (container main) lost" in forced.output
        assert gpus.info(2).mig_enabled


def kubelet_checkpoint(plugins: Path, entries: list[dict[str, object]]) -> None:
    """The kubelet device manager's checkpoint, as kubelets since 1.20 write it."""
    data = {
        "Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}},
        "Checksum": 1234567890,
    }
    (plugins / KUBELET_CHECKPOINT).write_text(json.dumps(data))


def test_where_pod_resources_does_not_answer_the_kubelet_checkpoint_names_the_pod(
    node: GpuNode, balanced: str, sim_state_dir: Path, kubelet_dirs: tuple[Path, Path]
) -> None:
    socket, plugins = kubelet_dirs  # the socket is never served
    entry = {
        "PodUID": "5d6c1c0e-0000-4000-8000-00000000a001",
        "ContainerName": "main",
        "ResourceName": "nvidia.com/mig-3g.40gb",
        "DeviceIDs": {"0": [balanced]},
        "AllocResp": "",
    }
    kubelet_checkpoint(plugins, [entry])
    args = ["--pod-resources-socket", str(socket), "--kubelet-dir", str(plugins)]

    result = mig_apply(sim_state_dir, "-c", "all-1g.10gb", "--yes", *args)

    assert result.exit_code == 1, result.output
    assert (
        "(held by pod uid 5d6c1c0e-0000-4000-8000-00000000a001 (container main))" in result.output
    )
    assert balanced in {g.uuid for g in node.mig_instances(3)}


def test_when_what_pods_hold_cannot_be_read_nothing_is_destroyed(
    node: GpuNode, balanced: str, sim_state_dir: Path, kubelet_dirs: tuple[Path, Path]
) -> None:
    socket, plugins = kubelet_dirs
    socket.write_text("")  # a kubelet is there (its socket exists) but does not answer
    (plugins / KUBELET_CHECKPOINT).write_text('{"Data": {"PodDeviceEntries": [')  # torn
    before = {i: layout(node, i) for i in range(node.count())}
    args = ["--pod-resources-socket", str(socket), "--kubelet-dir", str(plugins)]

    result = mig_apply(sim_state_dir, "-c", "all-1g.10gb", "--yes", *args)

    assert result.exit_code == 1, result.output
    assert "cannot tell which workloads hold its instances" in result.output
    assert f"kubelet checkpoint {plugins / KUBELET_CHECKPOINT} is damaged" in result.output
    assert {i: layout(node, i) for i in range(node.count())} == before


# --- the reconciler --------------------------------------------------------------------------


def test_the_reconciler_keeps_what_a_claim_holds_unless_mig_force(
    node: GpuNode, driver: Driver, sim_state_dir: Path, tmp_path: Path
) -> None:
    uid = prepare(driver, "train")
    held = claim_instance(node)

    def config(force: bool):  # the agent whose DRA driver prepared the claim
        path = tmp_path / "agent.yaml"
        path.write_text(
            f"version: v1\nstate_dir: {sim_state_dir / 'agent'}\n"
            f"mig: {{allow_reset: true, force: {str(force).lower()}}}\n"
            "pools:\n  default: {mig_layout: all-1g.10gb}\n"
        )
        return load_agent_config(path, environ={})

    reconciler = MigReconciler(node, config(False), lock_file=tmp_path / "mig.lock")
    reconciler.reconcile_once()
    status = reconciler.status()
    assert status is not None
    assert not status.applied
    assert "held by DRA claim team-a/train" in status.reason
    assert claim_instance(node) == held

    reconciler.reload(config(True))
    reconciler.reconcile_once()
    assert reconciler.last_report is not None
    assert reconciler.last_report.ok
    assert claim_instance(node) != held
    assert read_claims(checkpoint_path(sim_state_dir / "agent"))[uid].failed


# --- the device names the holds are read by --------------------------------------------------


def test_every_published_mig_device_name_reads_back_as_its_instance(node: GpuNode) -> None:
    """The holds parse the DRA plugin's device names; each published name (for every profile
    and placement of the model) must name exactly the instance made at that placement."""
    from nodeagent.holds import Holds, _claim_devices
    from nodeagent.holds.dra_checkpoint import ClaimRecord, PreparedDevice

    devices = build_slices(node.snapshot(), SliceSpec(NODE, DRIVER, dynamic_mig=True)).devices
    names = [n for n in devices if n.startswith("gpu-0-mig-")]
    geometry = node.mig_geometry(0)
    assert geometry is not None
    assert len(names) == sum(len(p.placements) for p in geometry.profiles)
    for name in names:
        record = ClaimRecord("u", "ns", "c", (PreparedDevice(("r",), NODE, name),), True)
        holds = Holds(tuple(_claim_devices(record)))
        profile_id, start = (int(x) for x in name.split("-")[-2:])
        profile = next(p for p in geometry.profiles if p.profile_id == profile_id)
        gi = node.create_gpu_instance(0, profile.name, next(
            q for q in profile.placements if q.start == start
        ))  # fmt: skip
        try:
            assert [h.kind for h in holds.of_instance(gi)] == [CLAIM], name
            # The same name on another GPU holds nothing here.
            elsewhere = ClaimRecord(
                "v", "ns", "d", (PreparedDevice(("r",), NODE, name.replace("gpu-0", "gpu-1")),)
            )
            assert Holds(tuple(_claim_devices(elsewhere))).of_instance(gi) == ()
        finally:
            node.destroy_gpu_instance(0, gi.instance_id)


@pytest.mark.parametrize("output", [[], ["--json"]], ids=["text", "json"])
def test_a_blocked_apply_says_why_on_stderr_in_one_line(
    node: GpuNode, driver: Driver, sim_state_dir: Path, output: list[str]
) -> None:
    # The real-kubelet case: a DRA claim still holds its instance (its namespace being
    # deleted) when the boot unit applies all-enabled. The report goes to stdout; a caller
    # that keeps only stderr must still learn the cause and the way out.
    prepare(driver, "train")

    result = mig_apply(sim_state_dir, "-c", "all-enabled", "--yes", "--allow-reset", *output)

    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: mig apply did not apply layout 'all-enabled': GPU 7: "), line
    assert "blocked-busy" in line
    assert "held by DRA claim team-a/train" in line
    assert "nothing was changed" in line
    assert "--partial" in line
    assert "--force" in line
    if output:
        assert json.loads(result.stdout)["ok"] is False  # stdout stays pure JSON


def test_a_partial_apply_blocked_on_one_gpu_says_the_others_were_applied(
    node: GpuNode, driver: Driver, sim_state_dir: Path
) -> None:
    prepare(driver, "train")

    result = mig_apply(sim_state_dir, "-c", "all-1g.10gb", "--yes", "--partial")

    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    assert "GPU 7: blocked-busy" in line
    assert "the other GPUs were applied" in line
    assert "--partial" not in line
    assert layout(node, 0) != []  # the other GPUs were indeed applied


def test_a_blocked_dry_run_says_why_on_stderr(
    node: GpuNode, driver: Driver, sim_state_dir: Path
) -> None:
    prepare(driver, "train")

    result = mig_apply(sim_state_dir, "-c", "all-enabled", "--dry-run")

    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: mig apply would not apply layout 'all-enabled': GPU 7: ")
    assert "nothing was changed (a plan)" in line
