"""The health state files when the disk is full or a file is replaced by a directory.

The promise (docs/operations.md, "State files"): a write that fails is one clear error, logged
once per change of state and never as a traceback; the last good file stays as it was, with no
temporary file beside it; the faults stay in memory and reach the disk as soon as it frees, so
an agent restarted after that remembers them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from nodeagent.health.model import HealthModel
from nodeagent.health.reporter import Reporter
from nodeagent.runtime.health_source import HealthState
from tests.health.conftest import MakeRig
from tests.health.fulldisk import small_disk


def _state_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("health state not written")]


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r.getMessage() for r in caplog.records if r.exc_info], "a traceback was logged"


def test_a_full_disk_under_the_state_dir_is_one_line_and_the_fault_survives_a_restart(
    make_rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    with small_disk() as disk:
        state = disk.path / "state"
        history, status = state / "health" / "history.json", state / "health" / "status.json"
        rig = make_rig("dgx-h100", history=history, recovery_quiet_s=60)
        reporter = Reporter(rig.model, state, "node-1")
        reporter.report_once()
        good = status.read_bytes()
        assert json.loads(good)["health"] == "healthy"

        disk.fill()
        with caplog.at_level(logging.INFO, logger="nodeagent"):
            rig.control.inject("xid", 3, code=79)  # while the disk is full
            for _ in range(5):  # five reports, each trying the history and the status
                rig.clock.advance(1)
                rig.pump()
                reporter.report_once()
            lines = _state_lines(caplog)
            assert len(lines) == 1, [r.getMessage() for r in lines]
            assert lines[0].levelno == logging.ERROR
            assert str(state / "health") in lines[0].getMessage()
            assert "the file system is full; free space on it" in lines[0].getMessage()
            _no_tracebacks(caplog)
            # The last good state is kept, whole, and no temporary file is left on the disk.
            assert status.read_bytes() == good
            assert disk.stray_files() == []
            assert rig.gpu(3).state is HealthState.LOST  # held in memory meanwhile

            disk.free()
            rig.clock.advance(1)
            reporter.report_once()
            assert any("health state written again" in r.getMessage() for r in caplog.records)
        assert json.loads(status.read_text())["health"] == "lost"

        # A restart after the disk freed: the fault seen while it was full is remembered.
        restarted = HealthModel(rig.model.config, history_path=history, clock=rig.clock)
        assert restarted.device_health()[rig.uuids[3]].state is HealthState.LOST


def test_a_status_file_replaced_by_a_directory_is_logged_once_per_change(
    make_rig: MakeRig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rig = make_rig("dgx-h100", history=tmp_path / "health" / "history.json")
    status = tmp_path / "health" / "status.json"
    reporter = Reporter(rig.model, tmp_path, "node-1")
    with caplog.at_level(logging.INFO, logger="nodeagent"):
        reporter.report_once()
        status.unlink()
        status.mkdir()
        for gpu in (1, 2, 3):  # every change is a status write; each one fails
            rig.control.inject("xid", gpu, code=79)
            rig.clock.advance(1)
            rig.pump()
            reporter.report_once()
        lines = _state_lines(caplog)
        assert [r.getMessage() for r in lines] == [
            f"health state not written: cannot write {status}: it is a directory; remove that "
            "directory; the last good files are kept, the health stays in memory and every "
            "report retries"
        ]
        status.rmdir()
        reporter.report_once()
        assert json.loads(status.read_text())["health"] == "lost"
        status.unlink()
        status.mkdir()  # the same fault again, after a good write: a new change of state
        rig.control.inject("xid", 4, code=79)
        rig.pump()
        reporter.report_once()
        assert len(_state_lines(caplog)) == 2
        _no_tracebacks(caplog)
