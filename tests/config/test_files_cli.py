"""Through the real CLI: a bad file of any kind is `error:` lines and a hint, exit 2, no traceback.

Every command that reads a file is driven with every kind of damage the reader refuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodeagent.cli.main import app

SIM = ["--simulate", "dgx-h100"]


def _commands(tmp: Path) -> dict[str, Callable[[Path], list[str]]]:
    sim = [*SIM, "--state-dir", str(tmp / "sim")]
    return {
        "run -c": lambda f: ["run", "-c", str(f), *sim],
        "health -c": lambda f: ["health", "-c", str(f)],
        "status -c": lambda f: ["status", "-c", str(f)],
        "mig plan --agent-config": lambda f: ["mig", "plan", "--agent-config", str(f), *sim],
        "mig plan -f": lambda f: ["mig", "plan", "-f", str(f), "-c", "x", *sim],
        "mig apply -f": lambda f: ["mig", "apply", "-f", str(f), "-c", "x", "--yes", *sim],
        "mig assert -f": lambda f: ["mig", "assert", "-f", str(f), "-c", "x", *sim],
        "mig apply -k": lambda f: ["mig", "apply", "-c", "all-1g", "-k", str(f), "--yes", *sim],
        "tiering run --policy": lambda f: ["tiering", "run", "--policy", str(f), "--once"],
        "tiering report --policy": lambda f: ["tiering", "report", "--policy", str(f)],
    }


COMMANDS = list(_commands(Path()))

DAMAGE: list[object] = [
    pytest.param(b"version: v1\nx: caf\xe9\n", 2, id="non-utf8"),
    pytest.param(b"version: v1\nx: !!python/object:os.system {}\n", 2, id="python-tag"),
    pytest.param(b"version: v1\nx: !foo 1\n", 2, id="unknown-tag"),
    pytest.param(b"version: v1\nx: [\n", 3, id="syntax"),
    pytest.param(b"", None, id="empty"),
    pytest.param(b"- version: v1\n", 1, id="top-level-list"),
    pytest.param(b"version: v1\n" + b"#" * (2 * 1024 * 1024) + b"\n", None, id="huge"),
    pytest.param("directory", None, id="directory"),
    pytest.param("under-a-file", None, id="unreadable"),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("damage", "line"), DAMAGE)
def test_bad_file_exits_2_in_error_lines(
    tmp_path: Path, command: str, damage: bytes | str, line: int | None
) -> None:
    if damage == "directory":
        path = tmp_path / "a-directory"
        path.mkdir()
    elif damage == "under-a-file":
        (tmp_path / "plain").write_text("x")
        path = tmp_path / "plain" / "file.yaml"
    else:
        assert isinstance(damage, bytes)
        path = tmp_path / "file.yaml"
        path.write_bytes(damage)
    args = _commands(tmp_path)[command](path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit)  # not an escaped exception
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert lines
    assert all(x.startswith(("error: ", "hint: ")) for x in lines), lines
    assert lines[-1].startswith("hint: ")
    where = f"error: {path}:{line}: " if line is not None else f"error: {path}: "
    assert lines[0].startswith(where), lines
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["mig", "plan", "-c", "x", *SIM, "-f"], id="layout"),
        pytest.param(["run", *SIM, "-c"], id="agent-config"),
    ],
)
def test_a_real_process_prints_no_traceback(tmp_path: Path, args: list[str]) -> None:
    """The installed entry point, in its own process: what an operator's shell sees."""
    path = tmp_path / "file.yaml"
    path.write_bytes(b"version: v1\nx: !!python/object/apply:os.system [echo owned]\n")
    result = subprocess.run(
        [sys.executable, "-m", "nodeagent.cli.main", *args, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NODEAGENT_SIM_STATE": str(tmp_path / "sim")},
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines()[0] == (
        f"error: {path}:2: YAML tag !!python/object/apply:os.system is not supported; "
        "nodeagent reads plain YAML (mappings, lists, strings, numbers, true/false): remove the tag"
    )
    assert "Traceback" not in result.stderr
