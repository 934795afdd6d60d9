"""``make cluster KUBELETS=N`` (``python -m nodeagent.testing.kube --kubelets N``): bad input
and missing programs are one line, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.testing.kube.controlplane import ControlPlaneError
from nodeagent.testing.kube.realnode import ENV_NODE_BINS, node_bins_dir

pytestmark = pytest.mark.kubelet


def _cluster(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodeagent.testing.kube", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def test_a_negative_count_is_one_line_and_exit_2() -> None:
    result = _cluster("--kubelets", "-1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --nodes and --kubelets take a count of 0 or more"
    ]


def test_missing_node_programs_are_one_line_naming_make_kube_bins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kubelet").write_text("")
    monkeypatch.setenv(ENV_NODE_BINS, str(tmp_path))
    with pytest.raises(ControlPlaneError, match=r"\(fakecri\); run `make kube-bins`"):
        node_bins_dir()
    result = _cluster("--kubelets", "1", env={ENV_NODE_BINS: str(tmp_path)})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "node programs missing" in lines[0]
    assert "make kube-bins" in lines[0]
