"""The agent component: factory, kubelet-dir override, start from a snapshot, SIGHUP reload."""

from __future__ import annotations

import threading

import pytest

from nodeagent.agent.component import AgentContext
from nodeagent_device_plugin.component import build_component
from nodeagent_device_plugin.resources import ResourceError
from tests.device_plugin.conftest import make_config
from tests.device_plugin.kubelet import TestKubelet
from tests.device_plugin.support import enable_mig


def test_disabled_in_config_builds_nothing(make_node, tmp_path) -> None:
    ctx = AgentContext(
        make_config({"device_plugin": {"enabled": False}}), make_node("t4"), tmp_path
    )
    assert build_component(ctx) is None


def test_runs_from_snapshots_in_the_override_dir_and_reloads(make_node, short_dir) -> None:
    node = make_node("a30x4")
    kubelet_dir = {"device_plugin": {"kubelet_dir": str(short_dir / "kubelet")}}
    ctx = AgentContext(make_config(kubelet_dir), node, short_dir / "state")
    component = build_component(ctx)
    assert component is not None
    assert component.name == "device-plugin"
    kubelet = TestKubelet(short_dir / "kubelet")
    kubelet.start()
    stop = threading.Event()
    thread = threading.Thread(target=component.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert not component.ready  # no snapshot yet
        ctx.snapshots.publish(node.snapshot())
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
        ctx.snapshots.publish(node.snapshot())
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
    ctx = AgentContext(
        make_config(
            {"device_plugin": {"mig_strategy": "single", "kubelet_dir": str(short_dir / "kubelet")}}
        ),
        node,
        short_dir,
    )
    ctx.snapshots.publish(node.snapshot())
    component = build_component(ctx)
    assert component is not None
    with pytest.raises(ResourceError, match="same MIG mode"):
        component.run(threading.Event())
