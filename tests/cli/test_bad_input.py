"""Bad input found by a sweep of every command: each is one line and exit 2, never a traceback
or a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "nodeagent.cli.main"]


def nodeagent(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,  # a hang is the bug
        check=False,
    )


def test_a_state_dir_that_cannot_hold_the_lock_or_is_a_file(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for state_dir, says in (
        ("/proc/self", "cannot use the simulated node's state dir /proc/self: its lock file"),
        (str(a_file), f"cannot use the simulated node's state dir {a_file}: a file is in"),
    ):
        for command in (["gpus"], ["sim", "reset"]):
            result = nodeagent(*command, "--simulate", "t4", "--state-dir", state_dir)
            assert result.returncode == 2, result.stderr
            assert result.stderr.startswith(f"error: {says}"), result.stderr
            assert "Traceback" not in result.stderr
    assert a_file.read_text() == "x"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(["status", "--watch", "nan"], "nan is not a finite number", id="watch-nan"),
        pytest.param(["status", "--watch", "inf"], "inf is not a finite number", id="watch-inf"),
        pytest.param(
            ["mig", "apply", "-c", "all-1g.10gb", "--yes", "--lock-timeout", "nan"],
            "nan is not a finite number",
            id="lock-timeout-nan",
        ),
        pytest.param(["run", "--log-level", "bogus"], "'bogus'", id="log-level"),
        pytest.param(
            ["dra", "slices", "--node-name", "Bad Name!"],
            "'Bad Name!' is not a valid Kubernetes node name",
            id="dra-node-name",
        ),
        pytest.param(
            ["sim", "inject", "xid", "--gpu", "0", "--code", "-1"],
            "XID -1 is not an XID",
            id="xid-negative",
        ),
        pytest.param(
            ["sim", "process", "add", "--gpu", "0", "--name", "a" * 2000],
            "process name '" + "a" * 40 + "'... (2000 characters) is not a command name",
            id="process-name-not-echoed-whole",
        ),
    ],
)
def test_numbers_and_names_options_refuse(tmp_path: Path, args: list[str], says: str) -> None:
    result = nodeagent(*args, "--simulate", "dgx-h100", "--state-dir", str(tmp_path / "sim"))
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(
            ["run", "--namespace", "Bad NS"], "'Bad NS' is not a valid namespace", id="run-ns"
        ),
        pytest.param(
            ["run", "--lease-name", "lease_1"], "'lease_1' is not a valid Lease name", id="lease"
        ),
        pytest.param(
            ["reset-breaker", "--namespace", "x_y"], "'x_y' is not a valid namespace", id="breaker"
        ),
        pytest.param(["report", "--namespace", "A"], "'A' is not a valid namespace", id="report"),
        pytest.param(
            ["quota", "render", "--prune"], "--prune deletes queues only when applying", id="prune"
        ),
    ],
)
def test_tiering_names_and_flags_refuse_before_any_request(
    tmp_path: Path, args: list[str], says: str
) -> None:
    """Refused before a policy is read or the API server is called: no server is given."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: v1\n")
    files = {"quota": ["-f", str(policy)], "run": ["--policy", str(policy)]}.get(args[0], [])
    result = nodeagent("tiering", *args, *files, "--server", "http://127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {says}"), result.stderr
    assert "Traceback" not in result.stderr


def test_a_review_period_past_any_calendar_is_refused() -> None:
    # Refused before any connection is made: the server named is never reached.
    result = nodeagent("tiering", "report", "--server", "http://127.0.0.1:9", "--since", "9999999d")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0] == (
        "error: '9999999d' is longer than the 10 years a duration may span"
    )


def test_paths_that_cannot_hold_what_is_written_are_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    (tmp_path / "root" / "etc" / "systemd").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "systemd" / "system").write_text("x")
    sim = ["--simulate", "t4", "--state-dir", str(tmp_path / "sim")]
    for args, says in (
        (["sim", "driver-root", str(a_file), *sim], f"cannot write {a_file}/"),
        (
            ["install-systemd", "--root", str(tmp_path / "root")],
            f"cannot create {tmp_path}/root/etc/systemd/system: a file is in its place",
        ),
        (["mig", "export", "-c", "", *sim], "-c '' cannot name a layout"),
    ):
        result = nodeagent(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith(f"error: {says}"), result.stderr
        assert "Traceback" not in result.stderr
    assert a_file.read_text() == "x"


def test_a_fixed_simulated_time_that_is_not_a_number_names_the_variable(tmp_path: Path) -> None:
    for value in ("abc", "inf"):
        result = subprocess.run(
            [*CLI, "gpus", "--simulate", "t4", "--state-dir", str(tmp_path / "sim")],
            capture_output=True,
            text=True,
            env={**os.environ, "NODEAGENT_SIM_TIME": value},
            timeout=30,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"error: NODEAGENT_SIM_TIME='{value}' is not a Unix time")
        assert "Traceback" not in result.stderr


def test_install_over_a_directory_where_the_config_goes_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc" / "nodeagent" / "nodeagent.yaml").mkdir(parents=True)
    result = nodeagent("install-systemd", "--root", str(root), "--prefix", sys.prefix)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(
        f"error: {root}/etc/nodeagent/nodeagent.yaml is not a config file"
    ), result.stderr
    assert not (root / "etc" / "systemd").exists()  # no unit was written before the refusal
