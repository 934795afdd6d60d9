"""A layout chosen on the node (the `nvidia.com/mig.config` label) wins over the pool's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from nodeagent.config.schema import AgentConfig, load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent_mig.reconciler import MigReconciler

MakeNode = Callable[..., GpuNode]


def agent_config(tmp_path: Path, layout: str) -> AgentConfig:
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nmig: {{allow_reset: true}}\n"
        f"pools:\n  default: {{mig_layout: {layout}}}\n"
    )
    config = load_agent_config(path, environ={})
    config.state_dir.mkdir(parents=True)
    return config


def profiles(node: GpuNode, index: int) -> list[str]:
    return sorted(gi.profile for gi in node.mig_instances(index))


def test_override_wins_over_the_pool_and_none_gives_the_pool_back(
    make_node: MakeNode, tmp_path: Path
) -> None:
    node = make_node("a30x4")
    reconciler = MigReconciler(node, agent_config(tmp_path, "all-2g"))
    reconciler.set_override("all-1g")
    reconciler.reconcile_once()
    status = reconciler.status()
    assert status is not None
    assert (status.layout, status.applied) == ("all-1g", True)
    assert profiles(node, 0) == ["1g.6gb"] * 4

    reconciler.set_override(None)
    reconciler.reconcile_once()
    status = reconciler.status()
    assert status is not None
    assert (status.layout, status.applied) == ("all-2g", True)
    assert profiles(node, 0) == ["2g.12gb"] * 2


def test_unknown_override_fails_and_changes_nothing(make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node("a30x4")
    reconciler = MigReconciler(node, agent_config(tmp_path, "all-2g"))
    reconciler.reconcile_once()
    reconciler.set_override("all-9g")
    reconciler.reconcile_once()
    status = reconciler.status()
    assert status is not None
    assert status.layout == "all-9g"
    assert not status.applied
    assert "all-9g" in status.reason
    assert profiles(node, 0) == ["2g.12gb"] * 2


def test_first_round_waits_for_the_node_label_when_asked_to(
    make_node: MakeNode, tmp_path: Path
) -> None:
    node = make_node("a30x4")
    reconciler = MigReconciler(node, agent_config(tmp_path, "all-2g"), await_override=True)
    stop = threading.Event()
    thread = threading.Thread(target=reconciler.run, args=(stop,))
    thread.start()
    try:
        # No round runs (and nothing on the GPUs changes) until the label has been read.
        assert not reconciler.wait_round(0, 1.5)
        assert not node.info(0).mig_enabled
        reconciler.set_override("all-1g")
        assert reconciler.wait_round(0, 10)
        status = reconciler.status()
        assert status is not None
        assert (status.layout, status.applied) == ("all-1g", True)
        assert profiles(node, 0) == ["1g.6gb"] * 4
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
