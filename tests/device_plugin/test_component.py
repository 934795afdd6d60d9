"""The agent component: factory, kubelet-dir override, start from a snapshot, SIGHUP reload."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from nodeagent.runtime.component import Idle
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.testing.kubelet import TestKubelet
from nodeagent.testing.nodes import enable_mig
from nodeagent_device_plugin.component import build
from tests.device_plugin.conftest import make_config


def test_disabled_in_config_builds_an_idle_component(short_dir) -> None:
    kubelet_dir = short_dir / "kubelet"
    kubelet_dir.mkdir()
    config = {"device_plugin": {"enabled": False, "kubelet_dir": str(kubelet_dir)}}
    component = build(make_config(config), SnapshotStore(), None)
    assert isinstance(component, Idle)
    assert component.name == "device-plugin"
    stop = threading.Event()
    stop.set()
    component.run(stop)  # returns at once: nothing to serve
    assert list(kubelet_dir.iterdir()) == []  # no socket, no registration
    # Other features ask it as they ask a plugin, and hear "no plugin" (not "nothing healthy").
    assert component.advertised() is None
    component.reload(make_config(config))
    assert list(kubelet_dir.iterdir()) == []


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


def test_readiness_holds_while_a_mig_change_re_serves_resources(make_node, short_dir) -> None:
    # A MIG layout applied GPU by GPU re-serves resources one after another, each registering
    # again half a second after its old server stops. /readyz follows this readiness: had it
    # dropped in each of those windows, the agent's pod would flap NotReady while it serves.
    node = make_node("a30x4")
    config = make_config(
        {"device_plugin": {"mig_strategy": "mixed", "kubelet_dir": str(short_dir / "kubelet")}}
    )
    snapshots = SnapshotStore()
    snapshots.publish(node.snapshot())
    component = build(config, snapshots, None)
    kubelet = TestKubelet(short_dir / "kubelet")
    kubelet.start()
    stop = threading.Event()
    thread = threading.Thread(target=component.run, args=(stop,), daemon=True)
    thread.start()
    seen: list[tuple[bool, bool]] = []  # (component ready, every resource registered)
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            manager = component.manager
            if manager is not None:
                seen.append((component.ready, manager.registered))
            time.sleep(0.005)

    try:
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 4)
        assert kubelet.wait(lambda: component.ready)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for index, profiles in enumerate([["4g.24gb"], ["2g.12gb", "2g.12gb"]]):
            enable_mig(node, {index: profiles})
            snapshots.publish(node.snapshot())
            kubelet.wait_devices("nvidia.com/gpu", lambda d, left=3 - index: len(d) == left)
        kubelet.wait_devices("nvidia.com/mig-2g.12gb", lambda d: len(d) == 2)
        assert kubelet.wait(lambda: component.manager is not None and component.manager.registered)
        watching.set()
        watcher.join(5)
    finally:
        watching.set()
        stop.set()
        thread.join(5)
        kubelet.stop()
    assert any(not registered for _, registered in seen), "no re-registration window was seen"
    assert all(ready for ready, _ in seen)


@pytest.mark.parametrize("fail_on_init_error", [True, False])
def test_a_layout_single_cannot_serve_is_said_once_and_served_once_fixed(
    make_node, short_dir, caplog, fail_on_init_error
) -> None:
    node = make_node("a30x4")
    enable_mig(node, {0: ["4g.24gb"]})  # GPU 0 in MIG mode, the others not: `single` refuses
    kubelet_dir = str(short_dir / "kubelet")
    config = make_config(
        {
            "device_plugin": {
                "mig_strategy": "single",
                "kubelet_dir": kubelet_dir,
                "fail_on_init_error": fail_on_init_error,
            }
        }
    )
    snapshots = SnapshotStore()
    snapshots.publish(node.snapshot())
    component = build(config, snapshots, None)
    assert component is not None
    kubelet = TestKubelet(short_dir / "kubelet")
    kubelet.start()
    stop = threading.Event()
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            component.run(stop)
        except Exception as exc:  # noqa: BLE001 - the supervisor would restart it, a traceback each time
            crashed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    caplog.set_level(logging.WARNING, logger="nodeagent_device_plugin.component")
    thread.start()
    try:
        assert kubelet.wait(lambda: bool(caplog.records))
        for _ in range(5):  # the same layout again is not another try, nor another line
            snapshots.publish(node.snapshot())
        time.sleep(0.3)
        assert crashed == []
        assert thread.is_alive()
        assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
        line = caplog.records[0].getMessage()
        assert "same MIG mode" in line
        assert "mig_strategy" in line  # says what to change
        assert ("refuses to start" in line) is fail_on_init_error
        assert component.advertised() == {}

        enable_mig(node, {1: ["4g.24gb"], 2: ["4g.24gb"], 3: ["4g.24gb"]})  # now one profile
        snapshots.publish(node.snapshot())
        kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 4)
        assert crashed == []
    finally:
        stop.set()
        thread.join(5)
        kubelet.stop()
