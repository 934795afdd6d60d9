"""The hardware checks rehearsed on simulated nodes, where no GPU is needed.

On a simulated node the simulator is the truth, so every check must pass; where the node is told
to behave unlike the model (a semantics switch), the check that holds that fact must fail. This
keeps the checks working and shows that they can fail, until a real GPU runs them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.agent.backend import open_node
from nodeagent.sim.control import SimControl
from nodeagent.testing.nodes import enable_mig
from tests.hardware.conftest import REHEARSAL

CHECKS = Path(__file__).with_name("test_real_gpu.py")


def _run_checks(state: Path) -> tuple[int, set[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env[REHEARSAL] = str(state)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "nvml", "-q", "-rfs", "-p", "no:cacheprovider",
         str(CHECKS)],
        env=env,
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    failed = set(re.findall(r"^FAILED \S+::(\w+)", done.stdout, re.M))
    passed = re.search(r"(\d+) passed", done.stdout)
    return int(passed.group(1)) if passed else 0, failed, done.stdout


@pytest.mark.parametrize(
    ("preset", "layout", "semantics", "failing"),
    [
        pytest.param(
            "dgx-h100",
            ["3g.40gb", "1g.10gb+me", "1g.10gb", "1g.10gb"],
            {},
            set(),
            id="h100-with-mig-and-media-engines",
        ),
        pytest.param("a30x4", ["2g.12gb+me", "1g.6gb"], {}, set(), id="a30"),
        pytest.param(
            "dgx-h100",
            ["7g.80gb"],
            {"profile_info_needs_mig": False},
            {"test_profile_info_is_refused_while_mig_is_off"},
            id="a-driver-that-lists-profiles-with-mig-off",
        ),
    ],
)
def test_the_checks_on_a_simulated_node(
    tmp_path: Path, preset: str, layout: list[str], semantics: dict[str, bool], failing: set[str]
) -> None:
    state = tmp_path / "node"
    control = SimControl(state, preset)
    if semantics:
        control.set_semantics(**semantics)
    with open_node(simulate=preset, state_dir=state) as node:
        enable_mig(node, {0: layout})
    passed, failed, output = _run_checks(state)
    assert failed == failing, output
    checks = len(re.findall(r"^def test_", CHECKS.read_text(), re.M))
    assert passed == checks - len(failing), output  # none was skipped for lack of data
