"""The GPU Operator's MIG label protocol, on the real control plane with the whole agent.

An operator sets ``nvidia.com/mig.config=<layout>`` on the node; the agent (with the deploy
manifests' RBAC) sets ``nvidia.com/mig.config.state`` to ``pending`` and then ``success`` or
``failed``, records an Event with the reason, and the simulated GPUs hold the named layout, or
are left exactly as they were. The label wins over the pool's ``mig_layout`` while it is set.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from typer.testing import CliRunner

from nodeagent.agent import mig_label
from nodeagent.agent.daemon import Agent
from nodeagent.cli.mig import app as mig_app
from nodeagent.config.schema import load_agent_config
from nodeagent.gpu.errors import GpuError
from nodeagent.gpu.node import GpuNode
from nodeagent.sim.control import SimControl
from nodeagent.testing.kube import waiting
from nodeagent.testing.kubelet import TestKubelet
from nodeagent.testing.waiting import wait_until

ONE_G, TWO_G = "nvidia.com/mig-1g.6gb", "nvidia.com/mig-2g.12gb"
CONFIG = mig_label.MIG_CONFIG_LABEL
STATE = mig_label.MIG_CONFIG_STATE_LABEL

# A mig-parted file as an operator's ConfigMap would hold it (A30-24GB: four 1g.6gb slices).
LAYOUTS = """\
version: v1
mig-configs:
  all-1g.6gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.6gb": 4}
  all-2g.12gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"2g.12gb": 2}
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.6gb": 5}
"""


def _layout(node: GpuNode) -> list[list[tuple[str, int]]]:
    """Each GPU's instances as (profile, start slice), in slice order."""
    return [
        sorted((gi.profile, gi.placement.start) for gi in node.mig_instances(i))
        for i in range(node.count())
    ]


def _holds(node: GpuNode, expected: list[list[tuple[str, int]]]) -> bool:
    """Whether the GPUs hold ``expected``, read while the agent may be changing them (an
    instance destroyed between listing it and reading its compute instances: not yet)."""
    try:
        return _layout(node) == expected
    except GpuError:
        return False


class _Slowed:
    """Makes each GPU instance creation on ``node`` take 0.2 s, counting them."""

    def __init__(self, node: GpuNode) -> None:
        self.created = 0
        self._node = node
        self._create = node.create_gpu_instance

        def create(index: int, profile: str, placement: Any) -> Any:
            time.sleep(0.2)
            self.created += 1
            return self._create(index, profile, placement)

        node.create_gpu_instance = create  # type: ignore[method-assign]

    def undo(self) -> None:
        self._node.create_gpu_instance = self._create  # type: ignore[method-assign]


def _slowed(node: GpuNode) -> _Slowed:
    return _Slowed(node)


def _all(profile: str, starts: list[int], gpus: int = 4) -> list[list[tuple[str, int]]]:
    return [[(profile, s) for s in starts] for _ in range(gpus)]


class StateRecorder:
    """Every value the node's state label takes, in order, read from a watch on the node."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.values: list[str | None] = []
        self._api = client.CoreV1Api(api)
        self._node = node_name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StateRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        # Each watch resumes where the last one ended, so no short-lived value falls between.
        version: str | None = None
        while not self._stop.is_set():
            resume = {"resource_version": version} if version else {}
            try:
                for event in watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self._api.list_node,
                    field_selector=f"metadata.name={self._node}",
                    timeout_seconds=1,
                    **resume,
                ):
                    node = event["object"]
                    version = node.metadata.resource_version
                    value = (node.metadata.labels or {}).get(STATE)
                    if not self.values or self.values[-1] != value:
                        self.values.append(value)
            except ApiException as exc:
                if exc.status != 410:
                    raise
                version = None  # compacted away: start from the node as it is


@pytest.fixture
def agent_env(
    make_node: Any, tmp_path: Path, kube_nodes: Any, kube_identities: Any, monkeypatch: Any
) -> tuple[str, Path, GpuNode]:
    """Node ``gpu`` in the API (labelled all-1g.6gb), its simulated a30x4, and the config."""
    # The label is read every 0.2 s instead of every 5 s, so the test waits less.
    monkeypatch.setattr(mig_label, "POLL_S", 0.2)
    node_name = kube_nodes.create("gpu", {CONFIG: "all-1g.6gb"}, gpus=4)
    (tmp_path / "dp").mkdir(exist_ok=True)
    layouts = tmp_path / "config.yaml"
    layouts.write_text(LAYOUTS)
    kubeconfig = kube_identities.agent.kubeconfig.path
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nnode: {{name: {node_name}, pool: p}}\n"
        "sampler: {interval_s: 0.1}\n"
        f"mig: {{allow_reset: true, layout_file: '{layouts}'}}\n"
        f"device_plugin: {{mig_strategy: mixed, kubelet_dir: '{tmp_path / 'dp'}'}}\n"
        "metrics: {enabled: false}\n"
        f"kubernetes: {{enabled: true, kubeconfig: '{kubeconfig}'}}\n"
        "health: {report_interval_s: 1}\n"
        "pools:\n  p: {mig_layout: all-2g.12gb}\n"
    )
    return node_name, config, make_node("a30x4")


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[TestKubelet]:
    """The test kubelet the agent's device plugin registers with."""
    (tmp_path / "dp").mkdir(exist_ok=True)
    kubelet = TestKubelet(tmp_path / "dp")
    kubelet.start()
    yield kubelet
    kubelet.stop()


def _labelled(key: str, value: str | None) -> Any:
    return lambda node: node["metadata"].get("labels", {}).get(key) == value


def _events(api: client.ApiClient, node_name: str, reason: str, count: int = 1) -> list[Any]:
    def enough(evs: list[Any]) -> list[Any] | None:
        found = [e for e in evs if e["reason"] == reason]
        return found if len(found) >= count else None

    return waiting.events(
        api,
        node_name,
        enough,
        what=f"{count} Event(s) {reason} on node {node_name}",
    )


def test_label_chooses_layout_reports_state_and_refuses_without_half_applying(
    agent_env: tuple[str, Path, GpuNode],
    control_plane: Any,
    sim_state_dir: Path,
    tmp_path: Path,
    kubelet: TestKubelet,
) -> None:
    node_name, config, node = agent_env
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    agent = Agent(load_agent_config(config, environ={}), node, config_path=config)

    def set_label(value: str | None) -> None:
        core.patch_node(node_name, {"metadata": {"labels": {CONFIG: value}}})

    with StateRecorder(api, node_name) as states:
        assert wait_until(lambda: states.values == [None], timeout_s=10)  # watching already
        agent.start()
        try:
            assert agent.wait_ready(30)
            # 1. At start the label wins over the pool's all-2g.12gb.
            waiting.node(api, node_name, _labelled(STATE, "success"), what="state success")
            assert _layout(node) == _all("1g.6gb", [0, 1, 2, 3])
            assert wait_until(lambda: states.values[-1:] == ["success"], timeout_s=5)
            assert states.values == [None, "pending", "success"], states.values
            _events(api, node_name, mig_label.EVENT_APPLIED)

            kubelet.wait_devices(ONE_G, lambda d: len(d) == 16, timeout_s=10)

            # 2. A new label: pending, then success, and the GPUs hold the new layout. Each
            # instance takes 0.2 s to make, as on a real driver, so the sampler sees the
            # layout half made; the kubelet must not: the device plugin was held.
            slow = _slowed(node)
            set_label("all-2g.12gb")
            assert wait_until(
                lambda: states.values[-3:] == ["success", "pending", "success"], timeout_s=30
            ), states.values
            assert _layout(node) == _all("2g.12gb", [0, 2])
            assert slow.created == 8
            _events(api, node_name, mig_label.EVENT_APPLIED, count=2)
            kubelet.wait_devices(TWO_G, lambda d: len(d) == 8, timeout_s=10)
            seen = {r: [len(d) for _, d in kubelet.plugins[r].lists] for r in (ONE_G, TWO_G)}
            assert set(seen[TWO_G]) == {8}, f"the kubelet saw a half-made layout: {seen}"
            assert set(seen[ONE_G]) <= {16, 0}, f"the kubelet saw a half-made layout: {seen}"
            slow.undo()

            # 3. A layout the file does not have: failed, the reason in an Event and in
            # `mig show`, and the GPUs untouched.
            before = _layout(node)
            set_label("no-such-layout")
            waiting.node(api, node_name, _labelled(STATE, "failed"), what="state failed")
            (failed,) = _events(api, node_name, mig_label.EVENT_FAILED)
            assert failed["type"] == "Warning"
            assert "no-such-layout" in failed["message"]
            assert "all-1g.6gb" in failed["message"]  # the names the file has
            assert _layout(node) == before
            shown = CliRunner().invoke(
                mig_app,
                [
                    "show",
                    "--json",
                    "--state-dir",
                    str(sim_state_dir),
                    "--agent-state-dir",
                    str(tmp_path / "state"),
                ],
            )
            assert shown.exit_code == 0, shown.output
            label = json.loads(shown.output)["mig_config_label"]
            assert (label["layout"], label["state"]) == ("no-such-layout", "failed")
            assert "no-such-layout" in label["reason"]

            # 4. A layout no GPU can hold (five 1g.6gb on an A30): failed, nothing half made.
            set_label("too-many")
            assert wait_until(
                lambda: states.values[-3:] == ["failed", "pending", "failed"], timeout_s=30
            ), states.values
            (_, too_many) = _events(api, node_name, mig_label.EVENT_FAILED, count=2)
            assert "too-many" in too_many["message"]
            assert _layout(node) == before

            # 5. A busy instance is never destroyed for the label (no mig.force): the layout
            # is refused on every GPU, the one in use named.
            set_label("all-1g.6gb")
            assert wait_until(lambda: states.values[-1:] == ["success"], timeout_s=30)
            assert _layout(node) == _all("1g.6gb", [0, 1, 2, 3])
            busy = next(gi for gi in node.mig_instances(2) if gi.placement.start == 0)
            SimControl(sim_state_dir).add_process(2, mig_uuid=busy.uuid)
            set_label("all-2g.12gb")
            assert wait_until(
                lambda: states.values[-3:] == ["success", "pending", "failed"], timeout_s=30
            ), states.values
            blocked = _events(api, node_name, mig_label.EVENT_FAILED, count=3)[-1]
            assert "busy" in blocked["message"]
            assert "GPU 2" in blocked["message"]
            assert _layout(node) == _all("1g.6gb", [0, 1, 2, 3])  # not even the idle GPUs

            # 6. Without the label, the pool's layout decides again.
            SimControl(sim_state_dir).remove_process(
                next(iter(next(gi for gi in node.mig_instances(2) if gi.busy).pids))
            )
            set_label(None)
            assert wait_until(lambda: _holds(node, _all("2g.12gb", [0, 2])), timeout_s=30)
        finally:
            assert agent.shutdown() == 0
