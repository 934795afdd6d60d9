"""`nodeagent mig show`: the slice map marks busy instances on every instance size."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodeagent.agent.backend import open_node
from nodeagent.cli.mig import CELL, app, slice_map
from nodeagent.gpu.types import MigGeometry
from nodeagent.sim.control import SimControl


def test_busy_marker_shows_for_every_profile(geometry: MigGeometry) -> None:
    """Busy and idle cells differ only in the marker, which survives the name filling the cell."""
    for profile in geometry.profiles:
        where = profile.placements[0]
        item = (profile.name, where.start, where.size)
        _, idle = slice_map(geometry.memory_slices, [(*item, False)])
        _, busy = slice_map(geometry.memory_slices, [(*item, True)])
        lo, hi = where.start * CELL, (where.start + where.size) * CELL
        idle_cell, busy_cell = idle[lo:hi], busy[lo:hi]
        assert (idle_cell[0], idle_cell[-1]) == ("[", "]"), (profile.name, idle)
        assert (busy_cell[0], busy_cell[-1]) == ("*", "*"), (profile.name, busy)
        # The marker costs no character of the name: the label inside is the same.
        assert busy_cell[1:-1] == idle_cell[1:-1], (profile.name, idle, busy)
        assert busy.count("*") == 2, (profile.name, busy)


LAYOUT = """
version: v1
mig-configs:
  mixed:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
"""


@pytest.mark.parametrize(
    ("busy_profiles", "busy_cells", "idle_cells"),
    [
        pytest.param(
            {"1g.10gb"},
            ["*1g.10gb*"],
            ["[1g.10gb]", "[----2g.20gb-----]", "[-------------3g.40gb--------------]"],
            id="one-slice-busy",
        ),
        pytest.param(
            {"2g.20gb", "3g.40gb"},
            ["*----2g.20gb-----*", "*-------------3g.40gb--------------*"],
            ["[1g.10gb][1g.10gb]"],
            id="larger-busy",
        ),
        pytest.param(set(), [], ["[1g.10gb][1g.10gb]"], id="nothing-busy"),
    ],
)
def test_show_marks_busy_instances(
    tmp_path: Path, busy_profiles: set[str], busy_cells: list[str], idle_cells: list[str]
) -> None:
    sim = tmp_path / "sim"
    layout = tmp_path / "layout.yaml"
    layout.write_text(textwrap.dedent(LAYOUT).lstrip(), encoding="utf-8")
    base = ["--simulate", "dgx-h100", "--state-dir", str(sim)]
    runner = CliRunner()
    applied = runner.invoke(
        app, ["apply", "-f", str(layout), "-c", "mixed", "--yes", "--allow-reset", *base]
    )
    assert applied.exit_code == 0, applied.output
    node = open_node(simulate="dgx-h100", state_dir=sim)
    marked: set[str] = set()
    for g in node.mig_instances(0):
        # One instance of each named profile gets a process (the first 1g.10gb only).
        if g.profile in busy_profiles and g.profile not in marked:
            assert g.uuid is not None
            SimControl(sim).add_process(0, mig_uuid=g.uuid)
            marked.add(g.profile)
    node.close()
    shown = runner.invoke(app, ["show", *base])
    assert shown.exit_code == 0, shown.output
    gpu0 = shown.stdout.split("GPU 1 ", 1)[0]
    body = gpu0.splitlines()[2]
    for cell in busy_cells + idle_cells:
        assert cell in body, (cell, gpu0)
    assert body.count("*") == 2 * len(busy_cells), gpu0
    assert ("(*...* = busy)" in gpu0) == bool(busy_cells), gpu0
