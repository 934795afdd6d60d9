"""MIG on the paths nobody designed for: a lost GPU, a busy GPU, a persistent creation fault,
a second apply at the same time, and a layout file the reconciler cannot read."""

from __future__ import annotations

import json
import logging
import os
import textwrap
import threading
from collections import Counter
from pathlib import Path

import pynvml
import pytest
from typer.testing import CliRunner

from nodeagent.agent.backend import mig_lock_file, open_node
from nodeagent.cli.main import app as main_app
from nodeagent.cli.mig import app
from nodeagent.config.schema import load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.lock import ProcessLock
from nodeagent.sim.control import SimControl
from nodeagent_mig.apply import reconcile
from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config, parse_config
from nodeagent_mig.reconciler import MigReconciler

CREATE = "nvmlDeviceCreateGpuInstanceWithPlacement"


def base(sim: Path, preset: str = "dgx-a100") -> list[str]:
    return ["--simulate", preset, "--state-dir", str(sim)]


def slots(node: GpuNode, index: int) -> set[tuple[str, int, int]]:
    return {(g.profile, g.placement.start, g.placement.size) for g in node.mig_instances(index)}


@pytest.fixture
def balanced(tmp_path: Path) -> tuple[GpuNode, Path]:
    """A DGX A100 with every GPU in all-balanced (3g, 2g, 2x1g)."""
    sim = tmp_path / "sim"
    node = open_node(simulate="dgx-a100", state_dir=sim)
    cfg = load_config(DEFAULT_CONFIG_FILE)
    assert reconcile(node, cfg, "all-balanced", state_dir=tmp_path / "seed", allow_reset=True).ok
    return node, sim


# --- item 3: a lost GPU stops nothing ------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["show"], id="show"),
        pytest.param(["show", "--json"], id="show-json"),
        pytest.param(["plan", "-c", "all-1g"], id="plan"),
        pytest.param(["plan", "-c", "all-1g", "--json"], id="plan-json"),
        pytest.param(["assert", "-c", "all-balanced"], id="assert"),
        pytest.param(["export"], id="export"),
        pytest.param(["apply", "-c", "all-balanced", "--yes"], id="apply"),
    ],
)
def test_a_lost_gpu_is_shown_as_lost_and_the_others_still_work(
    balanced: tuple[GpuNode, Path], command: list[str]
) -> None:
    _, sim = balanced
    SimControl(sim).inject("xid", 3, code=79)
    result = CliRunner().invoke(app, [*command, *base(sim)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    out = result.stdout
    if command[0] == "export":
        again = parse_config(out, "export.yaml")
        assert {d for s in again.configs["current"] for d in s.devices or ()} == {
            0,
            1,
            2,
            4,
            5,
            6,
            7,
        }
        assert "GPU 3" in result.stderr
        return
    if "--json" in command:
        gpus = json.loads(out)["gpus"]
        assert {g["index"] for g in gpus} == set(range(8))
        lost = [g for g in gpus if g.get("lost")]
        assert [g["index"] for g in lost] == [3]
        return
    assert "LOST" in out or "lost" in out
    if command[0] == "apply":
        # The report is on stdout; stderr names the cause in one line all the same.
        (line,) = result.stderr.splitlines()
        assert line.startswith("error: mig apply did not apply layout 'all-balanced': GPU 3: lost")
        assert "check it" in line
        return
    if command[0] == "assert":
        assert "GPUs 0,1,2,4,5,6,7 hold it" in out
        return
    for healthy in (0, 7):
        assert f"GPU {healthy}" in out or f"\n{healthy} " in out


def test_topo_json_keeps_the_lost_gpus_pairs(tmp_path: Path) -> None:
    SimControl(tmp_path, "dgx-h100").inject("lost", 5)
    result = CliRunner().invoke(main_app, ["topo", "--json", *base(tmp_path, "dgx-h100")])
    assert result.exit_code == 0  # the matrix marks the loss; `gpus` is the one that fails
    data = json.loads(result.stdout)
    assert len(data["links"]) == 28
    with_lost = [link for link in data["links"] if 5 in (link["a"], link["b"])]
    assert len(with_lost) == 7
    assert all(link["lost"] and link["label"] == "?" for link in with_lost)
    assert data["lost"] == [5]


# --- item 4: per-GPU outcome, and the others applied where the pool allows it ---------------------


def make_busy(node: GpuNode, sim: Path, gpu: int, profile: str) -> None:
    gi = next(g for g in node.mig_instances(gpu) if g.profile == profile)
    assert gi.uuid is not None
    SimControl(sim).add_process(gpu, mig_uuid=gi.uuid)


def test_one_busy_gpu_gives_each_gpu_its_own_outcome(
    balanced: tuple[GpuNode, Path], tmp_path: Path
) -> None:
    node, sim = balanced
    make_busy(node, sim, 7, "3g.20gb")
    before = {i: slots(node, i) for i in range(8)}
    report = reconcile(node, load_config(DEFAULT_CONFIG_FILE), "all-1g", state_dir=tmp_path)
    assert not report.ok
    outcomes = {g.index: g.outcome for g in report.gpus}
    assert outcomes == {**dict.fromkeys(range(7), "unchanged"), 7: "blocked-busy"}
    for g in report.gpus[:7]:
        assert not g.errors, g.errors  # no "verification failed" on GPUs never touched
        assert "GPU 7" in g.summary()
    assert "busy" in report.gpus[7].summary()
    assert all(len(line) <= 300 and "\n" not in line for line in report.summaries())
    assert {i: slots(node, i) for i in range(8)} == before


def test_a_partial_apply_changes_the_other_gpus_and_leaves_the_busy_one(
    balanced: tuple[GpuNode, Path], tmp_path: Path
) -> None:
    node, sim = balanced
    make_busy(node, sim, 7, "3g.20gb")
    busy_before = slots(node, 7)
    report = reconcile(
        node, load_config(DEFAULT_CONFIG_FILE), "all-1g", state_dir=tmp_path, partial=True
    )
    assert not report.ok
    assert [g.outcome for g in report.gpus] == ["applied"] * 7 + ["blocked-busy"]
    for i in range(7):
        assert Counter(p for p, _, _ in slots(node, i)) == {"1g.5gb": 7}
    assert slots(node, 7) == busy_before


def test_the_cli_prints_one_summary_line_per_gpu(balanced: tuple[GpuNode, Path]) -> None:
    node, sim = balanced
    make_busy(node, sim, 7, "3g.20gb")
    result = CliRunner().invoke(app, ["apply", "-c", "all-1g", "--yes", *base(sim)])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    for i in range(8):
        assert sum(1 for line in lines if line.startswith(f"GPU {i}: ")) == 1, result.stdout
    assert any(line.startswith("GPU 7: blocked-busy") for line in lines)


def test_the_reconciler_reports_per_gpu_in_short_lines_and_a_metric_status(
    make_node, sim_state_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = make_node("dgx-a100")
    config = agent_config(tmp_path, "all-balanced")
    reconciler = MigReconciler(node, config, lock_file=tmp_path / "mig.lock")
    reconciler.reconcile_once()
    status = reconciler.status()
    assert status is not None
    assert status.applied
    make_busy(node, sim_state_dir, 7, "3g.20gb")
    reconciler.reload(agent_config(tmp_path, "all-1g"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nodeagent_mig"):
        reconciler.reconcile_once()
        reconciler.reconcile_once()  # the same outcome again is not logged again
    status = reconciler.status()
    assert status is not None
    assert not status.applied
    assert status.reason.startswith("GPU 7: blocked-busy"), status.reason
    assert {g.gpu: g.outcome for g in status.gpus}[7] == "blocked-busy"
    messages = [r.getMessage() for r in caplog.records]
    assert messages, "the blocked apply was not logged"
    assert max(len(m) for m in messages) < 400, max(messages, key=len)
    assert sum(1 for m in messages if "GPU 7: blocked-busy" in m) == 1


# --- item 5: create before destroy; a failure restores or names what it could not ----------------


def test_a_persistent_creation_fault_costs_only_the_instances_in_the_way(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    node = open_node(simulate="dgx-a100", state_dir=sim)
    cfg = load_config(DEFAULT_CONFIG_FILE)
    assert reconcile(node, cfg, "all-1g", state_dir=tmp_path, allow_reset=True).ok
    before = slots(node, 3)
    assert len(before) == 7
    SimControl(sim).inject(
        "nvml-error", 3, function=CREATE, code=pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    )
    report = reconcile(node, cfg, "all-balanced", state_dir=tmp_path)
    gpu3 = report.gpus[3]
    assert gpu3.outcome == "failed"
    after = slots(node, 3)
    lost = before - after
    # Only what stood in the way of the first creation (a 2g or 3g: two or four slices).
    assert len(lost) <= 4, (before, after)
    assert {(s.profile, s.placement.start, s.placement.size) for s in gpu3.unrestored} == lost
    assert "could not restore" in gpu3.summary()
    assert all(g.outcome == "applied" for g in report.gpus if g.index != 3)


def test_new_instances_on_free_slices_are_created_before_anything_is_destroyed(
    tmp_path: Path,
) -> None:
    layouts = parse_config(
        textwrap.dedent(
            """
            version: v1
            mig-configs:
              start:
                - devices: [0]
                  mig-enabled: true
                  mig-devices: {"1g.5gb": 2}
              target:
                - devices: [0]
                  mig-enabled: true
                  mig-devices: {"1g.5gb": 1, "2g.10gb": 1, "3g.20gb": 1}
            """
        ),
        "t.yaml",
    )
    node = open_node(simulate="dgx-a100", state_dir=tmp_path / "sim")
    assert reconcile(node, layouts, "start", state_dir=tmp_path, allow_reset=True).ok
    steps: list[str] = []
    report = reconcile(
        node, layouts, "target", state_dir=tmp_path, on_step=lambda n, what: steps.append(what)
    )
    assert report.ok, report.to_dict()
    first_destroy = next((i for i, s in enumerate(steps) if "destroy" in s), len(steps))
    creates_first = [s for s in steps[:first_destroy] if "create" in s]
    assert len(creates_first) >= 1, steps


# --- item 2: one MIG apply at a time ------------------------------------------------------------


def test_a_second_apply_waits_for_the_lock_then_exits_2_naming_the_holder(
    balanced: tuple[GpuNode, Path],
) -> None:
    node, sim = balanced
    before = {i: slots(node, i) for i in range(8)}
    lock = ProcessLock(mig_lock_file("dgx-a100", sim), "test")
    lock.acquire()
    try:
        result = CliRunner().invoke(
            app, ["apply", "-c", "all-1g", "--yes", "--lock-timeout", "0.3", *base(sim)]
        )
    finally:
        lock.release()
    assert result.exit_code == 2, result.output
    assert f"process {os.getpid()}" in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2
    assert {i: slots(node, i) for i in range(8)} == before
    again = CliRunner().invoke(app, ["apply", "-c", "all-1g", "--yes", *base(sim)])
    assert again.exit_code == 0, again.output


def agent_config(tmp_path: Path, layout: str, layout_file: Path | None = None):
    path = tmp_path / "agent.yaml"
    file_line = f"  layout_file: {layout_file}\n" if layout_file else ""
    path.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nmig:\n  allow_reset: true\n{file_line}"
        f"pools:\n  default: {{mig_layout: {layout}}}\n"
    )
    return load_agent_config(path, environ={})


def test_the_reconciler_skips_a_round_while_another_apply_holds_the_lock(
    make_node, sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-a100")
    config = agent_config(tmp_path, "all-balanced")
    lock_path = mig_lock_file("dgx-a100", sim_state_dir)
    reconciler = MigReconciler(node, config, lock_file=lock_path)
    holder = ProcessLock(lock_path, "an operator's apply")
    holder.acquire()
    try:
        reconciler.reconcile_once()
    finally:
        holder.release()
    assert not any(node.info(i).mig_enabled for i in range(8))
    status = reconciler.status()
    assert status is not None
    assert not status.applied
    assert str(os.getpid()) in status.reason
    reconciler.reconcile_once()
    assert reconciler.applied_layout == "all-balanced"


# --- item 10 (the reconciler's part): a bad layout file keeps it ready and idle -------------------


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"version: v1\nmig-configs:\n  all-1g\xff: []\n", id="non-utf8"),
        pytest.param(b"version: v1\nmig-configs: !!python/name:os.system\n", id="yaml-tag"),
        pytest.param(b"version: v9\n", id="bad-version"),
    ],
)
def test_a_bad_layout_file_is_reported_once_and_the_reconciler_stays_ready(
    make_node, tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    bad = tmp_path / "layouts.yaml"
    bad.write_bytes(content)
    node = make_node("dgx-a100")
    reconciler = MigReconciler(
        node, agent_config(tmp_path, "all-1g", bad), lock_file=tmp_path / "l"
    )
    stop = threading.Event()
    with caplog.at_level(logging.ERROR, logger="nodeagent_mig"):
        thread = threading.Thread(target=reconciler.run, args=(stop,))
        thread.start()
        try:
            for _ in range(200):
                if reconciler.ready:
                    break
                stop.wait(0.01)
            assert reconciler.ready
            reconciler.reconcile_once()  # a retry finds the same file: no second log line
        finally:
            stop.set()
            thread.join(5)
    assert not thread.is_alive()
    assert reconciler.last_error is not None
    assert str(bad) in reconciler.last_error
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    status = reconciler.status()
    assert status is not None
    assert not status.applied
    assert not any(node.info(i).mig_enabled for i in range(8))


# --- export -o: a path that cannot be written is one line, and nothing half written --------------


@pytest.mark.parametrize(
    "where",
    [
        pytest.param("missing-dir/layout.yaml", id="directory-missing"),
        pytest.param(".", id="a-directory"),
        pytest.param("file/layout.yaml", id="under-a-file"),
    ],
)
def test_export_to_a_path_it_cannot_write_is_one_line_and_exit_2(
    balanced: tuple[GpuNode, Path], tmp_path: Path, where: str
) -> None:
    _, sim = balanced
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "file").write_text("kept\n")
    target = out_dir / where
    result = CliRunner().invoke(app, ["export", "-o", str(target), *base(sim)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert str(target) in errors[0]
    assert "hint:" in result.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["file"]  # no temporary file left
    assert (out_dir / "file").read_text() == "kept\n"
