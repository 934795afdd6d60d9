"""The agent component: factory, kubelet-dir override, start from a snapshot, SIGHUP reload."""

from __future__ import annotations

import threading

import pytest

from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.testing.kubelet import TestKubelet
from nodeagent.testing.nodes import enable_mig
from nodeagent_device_plugin.component import build
from nodeagent_device_plugin.resources import ResourceError
from tests.device_plugin.conftest import make_config


def test_disabled_in_config_builds_nothing() -> None:
    assert build(make_config({"device_plugin": {"enabled": False}}), SnapshotStore(), None) is None


def test_runs_from_snapshots_in_the_override_dir_and_reloads(make_node, short_dir) -> None:
    node = make_node("a30x4")
    kubelet_dir = {"device_plugin": {"kubelet_dir": str(short_dir / "kubelet")}}
    snapshots = SnapshotStore()
    component = build(make_config(kubelet_dir), snapshots, None)
    assert component is not None
    assert component.name == "device-plugin"
    kubelet = TestKubelet(short_dir / "kubelet")
    kubelet.start()
    stop = threading.Event()
    thread = threading.Thread(target=component.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert not component.ready  # no snapshot yet
        snapshots.publish(node.snapshot())
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 4)
        assert kubelet.wait(lambda: component.ready)
        component.reload(
            make_config(
                {
                    "device_plugin": {
                        "mig_strategy": "mixed",
                        "kubelet_dir": str(short_dir / "kubelet"),
                    },
                    "pools": {"default": {"sharing": {"mode": "time-slicing", "replicas": 2}}},
                }
            )
        )
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
        enable_mig(node, {0: ["4g.24gb"]})  # a MIG change arrives through the next snapshot
        snapshots.publish(node.snapshot())
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 6)
        kubelet.wait_devices("nvidia.com/mig-4g.24gb", lambda d: len(d) == 2)
    finally:
        stop.set()
        thread.join(5)
        kubelet.stop()
    assert list((short_dir / "kubelet").glob("nodeagent-*.sock")) == []


def test_strategy_violation_crashes_when_fail_on_init_error(make_node, short_dir) -> None:
    node = make_node("a30x4")
    enable_mig(node, {0: ["4g.24gb"]})
    config = make_config(
        {"device_plugin": {"mig_strategy": "single", "kubelet_dir": str(short_dir / "kubelet")}}
    )
    snapshots = SnapshotStore()
    snapshots.publish(node.snapshot())
    component = build(config, snapshots, None)
    assert component is not None
    with pytest.raises(ResourceError, match="same MIG mode"):
        component.run(threading.Event())
