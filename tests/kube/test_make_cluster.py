"""`make cluster` (``python -m nodeagent.testing.kube``) before the programs are built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nodeagent.testing.kube.controlplane import PROGRAMS, bins_dir


def _partial_build(root: Path, programs: tuple[str, ...]) -> Path:
    """A bins directory as an interrupted `make kube-bins` leaves it: some programs only."""
    (root / "bin").mkdir(parents=True)
    for program in programs:
        (root / "bin" / program).write_text("#!/bin/sh\nexit 1\n")
        (root / "bin" / program).chmod(0o755)
    return root


def test_a_missing_kueue_manager_is_one_line_naming_it_and_make_kube_bins(tmp_path: Path) -> None:
    bins = _partial_build(tmp_path / "bins", PROGRAMS)
    env = {**os.environ, "NODEAGENT_KUBE_BINS": str(bins), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "nodeagent.testing.kube"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: control plane programs missing in {bins}/bin (kueue); "
        "run `make kube-bins` to build them"
    ]
    assert not list(tmp_path.glob("nodeagent-cp-*")), "a work directory was left behind"


def test_a_plane_without_kueue_does_not_need_the_kueue_manager(tmp_path: Path, monkeypatch) -> None:
    bins = _partial_build(tmp_path / "bins", PROGRAMS)
    monkeypatch.setenv("NODEAGENT_KUBE_BINS", str(bins))
    assert bins_dir(kueue=False) == bins
