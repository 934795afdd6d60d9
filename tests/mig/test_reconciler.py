"""The agent applies the pool's MIG layout at start and after a policy change, never by force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.config.schema import load_agent_config
from nodeagent.sim.control import SimControl
from nodeagent_mig.reconciler import MigReconciler


def agent_config(tmp_path: Path, layout: str):
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nmig: {{allow_reset: true}}\n"
        f"pools:\n  default: {{mig_layout: {layout}}}\n"
    )
    return load_agent_config(path, environ={})


def first_pass(node, config) -> MigReconciler:
    """A reconciler of ``config`` on ``node``, after its pass at agent start."""
    config.state_dir.mkdir(parents=True)
    reconciler = MigReconciler(node, config)
    reconciler.reconcile_once()
    return reconciler


def profiles(node, index: int) -> list[str]:
    return sorted(gi.profile for gi in node.mig_instances(index))


def test_layout_applied_at_start_then_changed_without_touching_busy_instances(
    make_node, sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    config = agent_config(tmp_path, "all-balanced")
    reconciler = first_pass(node, config)
    assert reconciler.last_report is not None
    assert reconciler.last_report.ok
    balanced = profiles(node, 0)
    assert balanced == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    status = json.loads((config.state_dir / "mig-status.json").read_text())
    assert status["ok"] is True
    assert status["layout"] == "all-balanced"

    # A job runs on GPU 0's 3g instance; the pool moves to all-1g, which needs its slices.
    busy = next(gi for gi in node.mig_instances(0) if gi.profile == "3g.40gb")
    SimControl(sim_state_dir).add_process(0, mig_uuid=busy.uuid)
    reconciler.reload(agent_config(tmp_path, "all-1g"))
    reconciler.reconcile_once()
    assert reconciler.last_report is not None
    assert not reconciler.last_report.ok
    assert busy.uuid in {gi.uuid for gi in node.mig_instances(0)}, "busy instance destroyed"
    assert profiles(node, 0) == balanced  # nothing half-applied on the blocked GPU


def test_an_invalid_layout_name_is_reported_and_changes_nothing(make_node, tmp_path: Path):
    node = make_node("dgx-h100")
    reconciler = first_pass(node, agent_config(tmp_path, "all-9g"))
    assert reconciler.last_error is not None
    assert "all-9g" in reconciler.last_error
    assert all(not node.info(i).mig_enabled for i in range(node.count()))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(
            b"version: v1\nmig-configs: caf\xe9\n", ":2: byte 0xe9 is not UTF-8", id="bytes"
        ),
        pytest.param(
            b"version: v1\nmig-configs: !!python/object:os.system {}\n",
            ":2: YAML tag !!python/object:os.system is not supported",
            id="tag",
        ),
        pytest.param(b"", ": the file is empty", id="empty"),
    ],
)
def test_a_damaged_layout_file_is_reported_and_the_reconciler_stays_up(
    make_node, tmp_path: Path, content: bytes, expected: str
) -> None:
    """The component reports the file's problem and stays idle; it never crash-loops."""
    layouts = tmp_path / "layouts.yaml"
    layouts.write_bytes(content)
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nmig: {{layout_file: {layouts}}}\n"
        "pools:\n  default: {mig_layout: all-1g}\n"
    )
    config = load_agent_config(path, environ={})
    node = make_node("dgx-h100")
    reconciler = first_pass(node, config)
    assert reconciler.last_error is not None
    assert f"{layouts}{expected}" in reconciler.last_error
    status = json.loads((config.state_dir / "mig-status.json").read_text())
    assert status["ok"] is False
    assert all(not node.info(i).mig_enabled for i in range(node.count()))
