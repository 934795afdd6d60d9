"""The composition layer: a feature the config turns off is an idle component, left out of the
supervised set (no thread, no name in the component list)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent import wiring
from nodeagent.config.schema import load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sharing.actions import SharingActions

ACTIONS_ON = {"pools": {"default": {"sharing_actions": {"enabled": True}}}}
METRICS_OFF = {"metrics": {"enabled": False}}


def _names(node: GpuNode, tmp_path: Path, overrides: dict[str, Any]) -> list[str]:
    config = load_agent_config(
        None,
        environ={},
        overrides={
            "state_dir": str(tmp_path / "state"),
            "device_plugin": {"kubelet_dir": str(tmp_path / "kubelet")},
            **overrides,
        },
    )
    wired = wiring.build(
        config,
        node,
        SnapshotStore(),
        restarts={},
        ready=lambda: True,
        alive=lambda: True,
        mig_lock_file=tmp_path / "mig.lock",
    )
    return [c.name for c in wired.components]


@pytest.mark.parametrize(
    ("overrides", "acts"),
    [
        pytest.param({}, False, id="off by default"),
        pytest.param(ACTIONS_ON, True, id="on"),
        pytest.param({**ACTIONS_ON, **METRICS_OFF}, False, id="on, but nothing measures"),
    ],
)
def test_the_sharing_actions_run_only_when_the_pool_asks_and_interference_is_measured(
    make_node: Callable[..., GpuNode], tmp_path: Path, overrides: dict[str, Any], acts: bool
) -> None:
    names = _names(make_node("dgx-h100"), tmp_path, overrides)
    assert (SharingActions.name in names) is acts
    # Without Kubernetes the MIG label is not read: its idle component is left out too.
    assert "mig-config-label" not in names
    assert names[0] == "sampler"


def test_a_disabled_device_plugin_and_dra_driver_get_no_thread_and_no_socket(
    make_node: Callable[..., GpuNode], tmp_path: Path
) -> None:
    (tmp_path / "kubelet").mkdir()
    on = _names(make_node("dgx-h100"), tmp_path / "on", {})
    assert "device-plugin" in on
    off = {"device_plugin": {"enabled": False, "kubelet_dir": str(tmp_path / "kubelet")}}
    dra = {
        "enabled": False,
        "registry_dir": str(tmp_path / "reg"),
        "plugin_dir": str(tmp_path / "p"),
    }
    names = _names(make_node("dgx-h100"), tmp_path, {**off, **ACTIONS_ON, "dra": dra})
    assert "device-plugin" not in names
    assert "dra" not in names
    # The sharing actions still run without a plugin to reload (they record what they would do).
    assert SharingActions.name in names
    assert list((tmp_path / "kubelet").iterdir()) == []
    assert not (tmp_path / "reg").exists()
    assert not (tmp_path / "p").exists()
