"""The MIG label protocol's parts: the device plugin's view of the snapshots stands still
while a MIG layout changes; where the label's layouts are read."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from nodeagent.agent.mig_label import HeldSnapshots, MigConfigLabel
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.config.schema import AgentConfig, load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import NodeSnapshot
from nodeagent.kube.node_patcher import make_api
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.testing.kube.controlplane import free_port
from nodeagent.testing.waiting import wait_until
from nodeagent_mig.reconciler import MigReconciler


def test_held_view_keeps_the_snapshot_from_before_the_change(
    make_node: Callable[..., GpuNode],
) -> None:
    node = make_node("a30x4")
    store = SnapshotStore()
    view = HeldSnapshots(store)
    seen: list[NodeSnapshot] = []
    view.subscribe(seen.append)
    before = node.snapshot()
    store.publish(before)
    assert (view.latest, view.generation, seen) == (before, 1, [before])

    view.hold()
    during = node.snapshot()
    store.publish(during)
    assert view.held
    assert view.latest is before
    assert view.generation == 1
    assert view.wait_newer(1, 0.05) is None  # nothing newer while held
    assert seen == [before]  # subscribers are not told either

    view.release()
    assert view.latest is during
    assert view.generation == 2
    assert view.wait_newer(1, 0.05) is during
    after = node.snapshot()
    store.publish(after)
    assert seen == [before, after]


def test_label_layouts_come_from_the_mounted_mig_parted_configmap_unless_a_file_is_set(
    make_node: Callable[..., GpuNode], tmp_path: Path
) -> None:
    node = make_node("a30x4")
    mounted = tmp_path / "mig-parted-config" / "config.yaml"

    def component(layout_file: Path | None) -> MigConfigLabel:
        return MigConfigLabel(
            api=None,
            node_name="gpu-1",
            reconciler=MigReconciler(node, AgentConfig(), lock_file=tmp_path / "mig.lock"),
            snapshots=SnapshotStore(),
            held=None,
            state_dir=tmp_path,
            layout_file=layout_file,
            mig_parted_file=mounted,
        )

    # No ConfigMap mounted (it is optional in the DaemonSet): the shipped layouts.
    assert component(None).file_for_label() is None
    mounted.parent.mkdir()
    mounted.write_text("version: v1\nmig-configs: {}\n")
    assert component(None).file_for_label() == mounted
    # mig.layout_file, when set, is the one file for the pool and the label alike.
    assert component(tmp_path / "mine.yaml").file_for_label() is None


def test_unreachable_api_server_lets_the_pool_layout_apply(
    make_node: Callable[..., GpuNode], tmp_path: Path
) -> None:
    node = make_node("a30x4")
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nmig: {{allow_reset: true}}\n"
        "pools:\n  default: {mig_layout: all-2g}\n"
    )
    config = load_agent_config(path, environ={})
    config.state_dir.mkdir(parents=True)
    reconciler = MigReconciler(node, config, await_override=True)
    # A port nothing listens on: every read of the label fails at once.
    api = make_api(KubernetesSection(enabled=True, api_server=f"http://127.0.0.1:{free_port()}"))
    label = MigConfigLabel(
        api=api,
        node_name="gpu-1",
        reconciler=reconciler,
        snapshots=SnapshotStore(),
        held=None,
        state_dir=config.state_dir,
        request_timeout_s=1.0,
    )
    stop = threading.Event()
    threads = [threading.Thread(target=c.run, args=(stop,)) for c in (reconciler, label)]
    for t in threads:
        t.start()
    try:
        # The reconciler does not wait for a label it cannot read: the pool's layout applies.
        assert wait_until(lambda: reconciler.ready and label.ready, timeout_s=20)
        status = reconciler.status()
        assert status is not None
        assert (status.layout, status.applied) == ("all-2g", True)
        assert sorted(gi.profile for gi in node.mig_instances(0)) == ["2g.12gb"] * 2
        assert label.state.state is None  # nothing claimed about a label never read
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not any(t.is_alive() for t in threads)
