"""Applier on simulated nodes: standard layouts, no-op applies, busy instances, rollback, hooks."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodeagent.agent.backend import open_node
from nodeagent.cli.mig import app
from nodeagent.gpu.errors import InsufficientResources
from nodeagent.gpu.node import GpuNode
from nodeagent.sim.control import SimControl
from nodeagent_mig.apply import INTENT_FILE, dry_run, prepare, reconcile
from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config, parse_config, parse_hooks

STANDARD = [
    "all-1g",
    "all-balanced",
    "all-2g",
    "all-3g",
    "all-4g",
    "all-7g",
    "all-enabled",
    "all-disabled",
]
MUTATING = (
    "set_mig_mode",
    "reset_gpu",
    "create_gpu_instance",
    "destroy_gpu_instance",
    "destroy_compute_instance",
)


def counting(node: GpuNode) -> list[str]:
    """Record every mutating GpuNode call (the real calls still run)."""
    calls: list[str] = []
    for name in MUTATING:
        real = getattr(node, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        setattr(node, name, spy)
    return calls


def layout(node: GpuNode, index: int) -> list[tuple[str, int, int]]:
    return [(g.profile, g.placement.start, g.placement.size) for g in node.mig_instances(index)]


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "hgx-h200"])
def test_standard_layouts_apply_assert_and_export_round_trip(preset: str, tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    node = open_node(simulate=preset, state_dir=sim)
    cfg = load_config(DEFAULT_CONFIG_FILE)
    runner = CliRunner()
    base = ["--simulate", preset, "--state-dir", str(sim)]
    for name in STANDARD:
        report = reconcile(node, cfg, name, state_dir=tmp_path / "mig", allow_reset=True)
        assert report.ok, (name, report.to_dict())
        result = runner.invoke(app, ["assert", "-c", name, *base])
        assert result.exit_code == 0, (name, result.output)
        exported = runner.invoke(app, ["export", *base])
        assert exported.exit_code == 0
        again = parse_config(exported.stdout, "export.yaml")
        calls = counting(node)
        report = reconcile(node, again, "current", state_dir=tmp_path / "mig")
        assert report.ok
        assert calls == [], (name, calls)
        assert not any(g.changed for g in report.gpus)
        node = open_node(simulate=preset, state_dir=sim)  # drop the spies
    assert not (tmp_path / "mig" / INTENT_FILE).exists()


def test_matching_layout_makes_no_mutating_call(tmp_path: Path) -> None:
    node = open_node(simulate="dgx-a100", state_dir=tmp_path / "sim")
    cfg = load_config(DEFAULT_CONFIG_FILE)
    assert reconcile(node, cfg, "all-balanced", state_dir=tmp_path, allow_reset=True).ok
    calls = counting(node)
    report = reconcile(node, cfg, "all-balanced", state_dir=tmp_path, allow_reset=True)
    assert report.ok
    assert calls == []
    assert report.mutating_steps == 0


def test_mode_change_without_reset_is_reported(tmp_path: Path) -> None:
    node = open_node(simulate="dgx-a100", state_dir=tmp_path / "sim")
    # A driver that leaves the mode pending until a reset (the simulator's semantics switch).
    SimControl(tmp_path / "sim").set_semantics(mig_mode_applies_at_once=False)
    cfg = load_config(DEFAULT_CONFIG_FILE)
    report = reconcile(node, cfg, "all-7g", state_dir=tmp_path)
    assert not report.ok
    for gpu in report.gpus:
        assert gpu.reset_required is not None
        assert "reset required" in gpu.reset_required
        assert "--allow-reset" in gpu.reset_required
    # Rerun with the reset allowed: the pending mode is taken from where it was left.
    report = reconcile(node, cfg, "all-7g", state_dir=tmp_path, allow_reset=True)
    assert report.ok
    assert all(layout(node, i) == [("7g.40gb", 0, 8)] for i in range(8))


TWO_GPU = """
version: v1
mig-configs:
  before:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 1, "1g.5gb": 2}
  grow:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 1, "1g.5gb": 2, "2g.10gb": 1}
  squeeze:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"7g.40gb": 1}
"""


def test_rollback_restores_previous_layout(tmp_path: Path) -> None:
    node = open_node(simulate="dgx-a100", state_dir=tmp_path / "sim")
    cfg = parse_config(textwrap.dedent(TWO_GPU), "t.yaml")
    assert reconcile(node, cfg, "before", state_dir=tmp_path, allow_reset=True).ok
    before = layout(node, 0)

    def fail_on_create(step: int, what: str) -> None:
        if "create" in what and "recreate" not in what:
            raise InsufficientResources("injected failure", gpu_index=0)

    report = reconcile(node, cfg, "squeeze", state_dir=tmp_path, on_step=fail_on_create)
    assert not report.ok
    assert "rolled back" in report.gpus[0].errors[0]
    assert layout(node, 0) == before
    assert [
        (s.profile, s.placement.start, s.placement.size) for s in report.gpus[0].holds
    ] == before
    assert report.to_dict()["gpus"][0]["holds"] == [
        {"profile": p, "start": s, "size": z} for p, s, z in before
    ]


def test_hooks_run_and_apply_exit_always_runs(tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    hooks = parse_hooks(
        textwrap.dedent(
            f"""
            version: v1
            hooks:
              apply-start:
                - command: /bin/sh
                  args: ["-c", "echo start $NODEAGENT_MIG_CONFIG >> {log}"]
              pre-apply-config:
                - command: /bin/sh
                  args: ["-c", "echo config >> {log}; exit 3"]
              apply-exit:
                - command: /bin/sh
                  args: ["-c", "echo exit >> {log}"]
            """
        )
    )
    node = open_node(simulate="dgx-a100", state_dir=tmp_path / "sim")
    cfg = load_config(DEFAULT_CONFIG_FILE)
    report = reconcile(node, cfg, "all-7g", state_dir=tmp_path, allow_reset=True, hooks=hooks)
    assert log.read_text().split("\n")[:3] == ["start all-7g", "config", "exit"]
    assert any("pre-apply-config" in e and "exited 3" in e for e in report.errors)
    assert not report.ok


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    node = open_node(simulate="dgx-a100", state_dir=tmp_path / "sim")
    cfg = load_config(DEFAULT_CONFIG_FILE)
    calls = counting(node)
    report = dry_run(prepare(node, cfg, "all-balanced"))
    assert calls == []
    assert Counter(c.profile for c in report.gpus[0].created) == {
        "1g.5gb": 2,
        "2g.10gb": 1,
        "3g.20gb": 1,
    }
    assert not node.info(0).mig_enabled


def copy_state(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_adding_beside_busy_instance_leaves_it_alone(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    node = open_node(simulate="dgx-a100", state_dir=sim)
    cfg = parse_config(textwrap.dedent(TWO_GPU), "t.yaml")
    assert reconcile(node, cfg, "before", state_dir=tmp_path, allow_reset=True).ok
    busy = next(g for g in node.mig_instances(0) if g.profile == "3g.20gb")
    assert busy.uuid is not None
    SimControl(sim).add_process(0, mig_uuid=busy.uuid)
    calls = counting(node)
    report = reconcile(node, cfg, "grow", state_dir=tmp_path)
    assert report.ok, report.to_dict()
    assert calls == ["create_gpu_instance"]
    after = {g.instance_id: g for g in node.mig_instances(0)}
    assert after[busy.instance_id].uuid == busy.uuid
    assert after[busy.instance_id].busy


def test_busy_instance_blocks_and_nothing_changes(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    node = open_node(simulate="dgx-a100", state_dir=sim)
    cfg = parse_config(textwrap.dedent(TWO_GPU), "t.yaml")
    assert reconcile(node, cfg, "before", state_dir=tmp_path, allow_reset=True).ok
    busy = node.mig_instances(0)[-1]
    assert busy.uuid is not None
    SimControl(sim).add_process(0, mig_uuid=busy.uuid)
    before = layout(node, 0)
    calls = counting(node)
    report = reconcile(node, cfg, "squeeze", state_dir=tmp_path)
    assert not report.ok
    assert calls == []
    label = f"{busy.profile}@{busy.placement.start}:{busy.placement.size}"
    assert report.gpus[0].outcome == "blocked-busy"
    assert label in report.gpus[0].summary()
    assert layout(node, 0) == before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n"
            "      mig-devices: {'9g.1gb': 1}\n",
            "offers no profile '9g.1gb'",
            id="unknown-profile",
        ),
        pytest.param(
            "version: v1\nmig-configs:\n  x:\n    - devices: [0]\n      mig-enabled: true\n"
            "      mig-devices: {'3g.20gb': 2, '2g.10gb': 1}\n",
            "needs 10 memory slices",
            id="beyond-capacity",
        ),
        pytest.param(
            "version: v1\nmig-configs:\n  x:\n    - devices: [12]\n      mig-enabled: false\n",
            "no GPU 12",
            id="selector-matches-nothing",
        ),
        pytest.param("version: v3\n", "unsupported version", id="bad-version"),
    ],
)
def test_invalid_files_exit_2_and_change_nothing(tmp_path: Path, text: str, message: str) -> None:
    sim = tmp_path / "sim"
    base = ["--simulate", "dgx-a100", "--state-dir", str(sim)]
    runner = CliRunner()
    before = runner.invoke(app, ["show", "--json", *base]).stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    result = runner.invoke(
        app, ["apply", "-f", str(bad), "-c", "x", "--yes", "--allow-reset", *base]
    )
    assert result.exit_code == 2
    assert message in result.stderr
    assert "hint:" in result.stderr
    assert "Traceback" not in result.stderr
    assert runner.invoke(app, ["show", "--json", *base]).stdout == before


# The apply runs in a child process that SIGKILLs itself, through the step hook, right before
# step ``kill_at``: the crash a power cut or an OOM kill would cause at that point.
KILL_SCRIPT = """
import os, signal, sys
from pathlib import Path
from nodeagent_mig.apply import reconcile
from nodeagent_mig.config import load_config
from nodeagent.agent.backend import open_node
sim, state, path, name, kill_at = sys.argv[1:]

def on_step(number, what):
    if number == int(kill_at):
        os.kill(os.getpid(), signal.SIGKILL)

node = open_node(simulate="dgx-a100", state_dir=Path(sim))
reconcile(node, load_config(path), name, state_dir=Path(state), allow_reset=True, on_step=on_step)
"""

CRASH_LAYOUTS = """
version: v1
mig-configs:
  start:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}
  target:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 1, "4g.20gb": 1}
    - devices: [1]
      mig-enabled: true
      mig-devices: {"2g.10gb": 2, "1g.10gb": 1}
"""


def test_kill_at_every_step_then_converges(tmp_path: Path) -> None:
    """SIGKILL before each mutating step of an apply; the next apply converges every time."""
    cfg_path = tmp_path / "layouts.yaml"
    cfg_path.write_text(textwrap.dedent(CRASH_LAYOUTS))
    cfg = load_config(cfg_path)
    seed = tmp_path / "seed"
    node = open_node(simulate="dgx-a100", state_dir=seed)
    # A driver that leaves the mode pending until a reset, so the apply has a reset step.
    SimControl(seed).set_semantics(mig_mode_applies_at_once=False)
    assert reconcile(node, cfg, "start", state_dir=tmp_path / "s0", allow_reset=True).ok
    # Count the steps on a copy, uninterrupted.
    probe = copy_state(seed, tmp_path / "probe")
    steps: list[str] = []
    report = reconcile(
        open_node(simulate="dgx-a100", state_dir=probe),
        cfg,
        "target",
        state_dir=tmp_path / "sp",
        allow_reset=True,
        on_step=lambda n, what: steps.append(what),
    )
    assert report.ok
    assert any("destroy compute instance" in s for s in steps)
    assert any("reset" in s for s in steps)
    for k in range(1, len(steps) + 1):
        sim = copy_state(seed, tmp_path / f"k{k}")
        state = tmp_path / f"state{k}"
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                KILL_SCRIPT,
                str(sim),
                str(state),
                str(cfg_path),
                "target",
                str(k),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == -signal.SIGKILL, (k, steps[k - 1], proc.stderr)
        assert (state / INTENT_FILE).exists()
        node = open_node(simulate="dgx-a100", state_dir=sim)
        report = reconcile(node, cfg, "target", state_dir=state, allow_reset=True)
        assert report.ok, (k, steps[k - 1], report.to_dict())
        assert report.resumed_from == "target"
        for index, want in ((0, {"3g.20gb": 1, "4g.20gb": 1}), (1, {"2g.10gb": 2, "1g.10gb": 1})):
            gis = node.mig_instances(index)
            assert Counter(g.profile for g in gis) == want, (k, steps[k - 1])
            assert all(len(g.compute_instances) == 1 for g in gis), (k, steps[k - 1])
        assert not (state / INTENT_FILE).exists()


def test_cli_refuses_to_destroy_without_yes_and_show_json(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    base = ["--simulate", "dgx-a100", "--state-dir", str(sim)]
    runner = CliRunner()
    first = runner.invoke(app, ["apply", "-c", "all-balanced", "--yes", "--allow-reset", *base])
    assert first.exit_code == 0, first.output
    before = runner.invoke(app, ["show", "--json", *base]).stdout
    refused = runner.invoke(app, ["apply", "-c", "all-7g", "--allow-reset", *base])
    assert refused.exit_code == 2
    assert "--yes" in refused.stderr
    assert runner.invoke(app, ["show", "--json", *base]).stdout == before
    gpu = json.loads(before)["gpus"][0]
    assert gpu["index"] == 0
    assert gpu["mig_enabled"] is True
    assert {i["profile"] for i in gpu["instances"]} == {"1g.5gb", "2g.10gb", "3g.20gb"}
    assert set(gpu["instances"][0]) >= {"profile", "placement", "uuid", "busy"}
    assert gpu["creatable"]["7g.40gb"] == 0
