"""The DRA driver's clean-up at unprepare obeys the rule `mig apply` obeys: an instance another
workload holds is kept (and the holder named in the log), and a claim `mig apply --force`
failed destroys nothing at its old placements and is not answered again (issue 32)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodeagent.cli.mig import app
from nodeagent.gpu.node import GpuNode
from nodeagent.holds import HoldSources
from nodeagent.kubelet.allocations import KUBELET_CHECKPOINT
from nodeagent.testing.nodes import enable_mig
from nodeagent_dra.driver import ClaimRef, Driver
from tests.dra.plugin_support import Claims, claim_json, make_driver

PRESET = "dgx-h100"
DEVICE = "gpu-7-mig-3g40gb-9-4"


@pytest.fixture
def node(make_node: Callable[..., GpuNode]) -> GpuNode:
    gpus = make_node(PRESET)
    enable_mig(gpus, {i: [] for i in range(gpus.count())})
    return gpus


@pytest.fixture
def driver(node: GpuNode, sim_state_dir: Path, tmp_path: Path) -> Driver:
    return make_driver(node, tmp_path / "dra", Claims(), state_dir=sim_state_dir / "agent")


def prepare(driver: Driver, name: str) -> ClaimRef:
    claims: Claims = driver.claims  # type: ignore[assignment]
    namespace, uid, claim = claims.add(claim_json(name, [("gpu", DEVICE)]))
    ref = ClaimRef(namespace, uid, claim)
    assert driver.prepare([ref])[uid].error == ""
    return ref


def at_slice_4(node: GpuNode) -> str | None:
    return next((g.uuid for g in node.mig_instances(7) if g.placement.start == 4), None)


def test_unprepare_keeps_an_instance_a_pod_holds(
    node: GpuNode, driver: Driver, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ref = prepare(driver, "train")
    uuid = at_slice_4(node)
    assert uuid is not None
    # The device plugin handed the same MIG device to a pod (the kubelet's checkpoint says so;
    # its pod-resources socket is not there).
    (short_dir / KUBELET_CHECKPOINT).write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": "pod-uid-1",
                            "ContainerName": "main",
                            "ResourceName": "nvidia.com/mig-3g.40gb",
                            "DeviceIDs": {"1": [uuid]},
                        }
                    ]
                },
                "Checksum": 1,
            }
        )
    )
    driver.holds = HoldSources.of_agent(driver.state_dir, short_dir / "none.sock", short_dir).read
    caplog.set_level(logging.WARNING)

    assert driver.unprepare([ref]) == {ref.uid: ""}

    assert at_slice_4(node) == uuid, "the pod's instance was destroyed"
    assert ref.uid not in driver.checkpoint.claims  # the claim itself is done
    assert "kept MIG 3g.40gb@4 on GPU 7 at unprepare of claim team-a/train: held by pod uid " \
        "pod-uid-1 (container main)" in caplog.text  # fmt: skip


def test_unprepare_destroys_its_idle_instance_when_nobody_else_holds_it(
    node: GpuNode, driver: Driver
) -> None:
    ref = prepare(driver, "train")
    assert at_slice_4(node) is not None
    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert at_slice_4(node) is None


def test_a_claim_mig_apply_forced_away_is_failed_and_its_old_placement_left_alone(
    node: GpuNode, driver: Driver, sim_state_dir: Path, tmp_path: Path
) -> None:
    ref = prepare(driver, "train")
    layouts = tmp_path / "layouts.yaml"
    gpu7 = "\n    - devices: [7]\n      mig-enabled: true\n      mig-devices: "
    layouts.write_text(
        f'version: v1\nmig-configs:\n  small:{gpu7}{{"1g.10gb": 7}}\n'
        f'  halves:{gpu7}{{"3g.40gb": 2}}\n'
    )
    base = ["--simulate", PRESET, "--state-dir", str(sim_state_dir), "-f", str(layouts), "--yes"]
    runner = CliRunner()
    forced = runner.invoke(app, ["apply", "-c", "small", "--force", *base], env={})
    assert forced.exit_code == 0, forced.output
    # Another layout puts a new 3g.40gb at the failed claim's old placement.
    assert runner.invoke(app, ["apply", "-c", "halves", *base], env={}).exit_code == 0
    newcomer = at_slice_4(node)
    assert newcomer is not None

    again = driver.prepare([ref])[ref.uid]
    assert again.error.startswith("claim team-a/train failed: nodeagent mig apply --force ")
    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert at_slice_4(node) == newcomer, "unprepare destroyed an instance that is not the claim's"
    assert ref.uid not in driver.checkpoint.claims
