"""MIG mode changes end to end through `nodeagent mig apply`, under both driver behaviours.

By default the simulator does what current drivers do: an idle GPU switches MIG mode at once
(Hopper and newer without a reset; on Ampere the driver resets the GPU itself), and the mode stays
pending only when activation fails because something holds the GPU. With the
``mig_mode_applies_at_once`` semantics off, every change waits for a GPU reset, as where the
driver cannot reset the GPU itself. `mig apply` must finish the change in every case it can, and
say plainly when it cannot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from nodeagent.cli.mig import app
from nodeagent.sim.control import SimControl

LAYOUT = """\
version: v1
mig-configs:
  halves:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
  halves-a100:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
"""


@dataclass(frozen=True)
class Case:
    preset: str
    layout: str
    at_once: bool  # the simulator's mig_mode_applies_at_once semantics
    busy: bool  # a process holds GPU 0 during the first apply


def _apply(sim: Path, tmp: Path, case: Case, *extra: str) -> Result:
    layout = tmp / "layout.yaml"
    layout.write_text(LAYOUT)
    args = ["apply", "-f", str(layout), "-c", case.layout, "--yes", "--json"]
    base = ["--simulate", case.preset, "--state-dir", str(sim), "--mig-state-dir", str(tmp / "m")]
    return CliRunner().invoke(app, [*args, *extra, *base])


def _gpu0(result: Result) -> dict[str, object]:
    gpus: list[dict[str, object]] = json.loads(result.stdout)["gpus"]
    return next(g for g in gpus if g["index"] == 0)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case("dgx-h100", "halves", True, False), id="hopper-idle"),
        pytest.param(Case("dgx-a100", "halves-a100", True, False), id="ampere-driver-resets"),
    ],
)
def test_an_idle_gpu_switches_at_once_without_allow_reset(tmp_path: Path, case: Case) -> None:
    sim = tmp_path / "sim"
    result = _apply(sim, tmp_path, case)
    assert result.exit_code == 0, result.output
    gpu = _gpu0(result)
    assert (gpu["mode_change"], gpu["reset_required"], gpu["reset"]) == ("enable", None, False)
    assert gpu["mig_enabled"] is True
    assert len(gpu["created"]) == 2  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        pytest.param(
            Case("dgx-a100", "halves-a100", False, False),
            "takes effect after a GPU reset",
            id="pending-until-reset",
        ),
        pytest.param(Case("dgx-h100", "halves", True, True), "in use", id="hopper-busy"),
    ],
)
def test_a_change_that_stays_pending_is_reported_and_finished_later(
    tmp_path: Path, case: Case, reason: str
) -> None:
    sim = tmp_path / "sim"
    control = SimControl(sim, case.preset)
    control.set_semantics(mig_mode_applies_at_once=case.at_once)
    pid = control.add_process(0) if case.busy else None
    first = _apply(sim, tmp_path, case)
    assert first.exit_code == 1, first.output
    gpu = _gpu0(first)
    assert gpu["mode_change"] == "enable"
    assert isinstance(gpu["reset_required"], str)
    assert reason in gpu["reset_required"]
    assert "--allow-reset" in gpu["reset_required"]
    assert (gpu["mig_enabled"], gpu["created"]) == (False, [])
    assert control.state()["gpus"][0]["mig"] == {"current": 0, "pending": 1}
    if pid is not None:
        control.remove_process(pid)
        # Idle now: requesting the mode again is enough on a driver that switches at once.
        again = _apply(sim, tmp_path, case)
        assert again.exit_code == 0, again.output
        assert (_gpu0(again)["reset"], _gpu0(again)["mig_enabled"]) == (False, True)
        return
    refused = _apply(sim, tmp_path, case)  # still waits: only a reset makes it current
    assert refused.exit_code == 1, refused.output
    done = _apply(sim, tmp_path, case, "--allow-reset")
    assert done.exit_code == 0, done.output
    gpu = _gpu0(done)
    assert (gpu["reset"], gpu["reset_required"], gpu["mig_enabled"]) == (True, None, True)
    assert len(gpu["created"]) == 2  # type: ignore[arg-type]


def test_the_text_report_says_whether_the_gpu_was_reset(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    case = Case("dgx-a100", "halves-a100", False, False)
    SimControl(sim, case.preset).set_semantics(mig_mode_applies_at_once=False)
    layout = tmp_path / "layout.yaml"
    layout.write_text(LAYOUT)
    base = ["--simulate", case.preset, "--state-dir", str(sim), "--mig-state-dir", str(tmp_path)]
    args = ["apply", "-f", str(layout), "-c", case.layout, "--yes", *base]
    pending = CliRunner().invoke(app, args)
    assert pending.exit_code == 1
    assert "reset required" in pending.stdout
    done = CliRunner().invoke(app, [*args, "--allow-reset"])
    assert done.exit_code == 0, done.output
    assert "MIG mode: enable (GPU reset)" in done.stdout
