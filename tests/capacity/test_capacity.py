"""What still fits on a MIG GPU, how fragmented it is, and what is stranded on a node.

:mod:`nodeagent.capacity` is shared by the MIG planner, the exporter, the DRA driver and the
tiering service; their tests check what each does with these numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nodeagent.capacity import (
    creatable,
    fragmentation_ratio,
    nvlink_components,
    room_beside,
    stranded_gpus,
    stranded_slices,
    whole_gpu_sizes,
)
from nodeagent.gpu.types import Link, LinkKind, MigGeometry, Placement
from tests.mig.conftest import sim_geometry


@dataclass(frozen=True)
class Slot:
    """An instance as capacity sees it: a profile at a placement."""

    profile: str
    placement: Placement


def inst(name: str, start: int, size: int) -> Slot:
    return Slot(name, Placement(start, size))


@pytest.fixture
def a100() -> MigGeometry:
    return sim_geometry("a100-40")


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        pytest.param([], 0.0, id="empty"),
        pytest.param([("7g.40gb", 0, 8)], 0.0, id="full"),
        pytest.param([("4g.20gb", 0, 4)], 0.0, id="half-clean"),
        pytest.param(
            [("1g.5gb", 0, 1), ("1g.5gb", 2, 1), ("1g.5gb", 4, 1), ("1g.5gb", 6, 1)],
            2 / 3,
            id="checkerboard",
        ),
    ],
)
def test_fragmentation_ratio(a100: MigGeometry, layout, expected) -> None:
    instances = [inst(n, s, z) for n, s, z in layout]
    assert fragmentation_ratio(a100, instances) == pytest.approx(expected)


def test_creatable_counts(a100: MigGeometry) -> None:
    got = creatable(a100, [inst("3g.20gb", 4, 4)])
    assert got == {
        "7g.40gb": 0,
        "4g.20gb": 1,
        "3g.20gb": 1,
        "2g.10gb": 2,
        "1g.10gb": 2,
        "1g.5gb": 4,
        "1g.5gb+me": 1,
    }


@pytest.mark.parametrize(
    ("layout", "sizes", "expected"),
    [
        pytest.param([], [], 0, id="empty GPU: every slice is usable"),
        pytest.param([("3g.20gb", 4, 4)], ["4g.20gb"], 0, id="the 4g still fits the free half"),
        pytest.param([("1g.5gb", 0, 1)], ["4g.20gb"], 7, id="the one 4g placement is taken"),
        pytest.param([("1g.5gb", 0, 1)], ["3g.20gb"], 3, id="slices 1-3 fit no 3g, 4-7 do"),
        pytest.param([("1g.5gb", 0, 1)], ["1g.5gb"], 1, id="no 1g.5gb placement covers slice 7"),
    ],
)
def test_stranded_slices(a100: MigGeometry, layout, sizes, expected) -> None:
    instances = [inst(n, s, z) for n, s, z in layout]
    assert stranded_slices(a100, instances, sizes) == expected


def test_whole_gpu_sizes_read_gpu_request_names_only() -> None:
    assert whole_gpu_sizes(["4gpu", " GPU ", "1g.5gb", "2 gpus", "0gpu"]) == [1, 2, 4]


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        pytest.param([], 0, id="no sizes: every free GPU is usable"),
        pytest.param(["1g.5gb"], 4, id="MIG-only pool: every free whole GPU is stranded"),
        pytest.param(["2gpu"], 2, id="2-GPU jobs: one of the group of 3, and the lone one"),
        pytest.param(["2gpu", "gpu"], 0, id="single-GPU jobs use them all"),
    ],
)
def test_stranded_gpus(sizes: list[str], expected: int) -> None:
    nv = Link(LinkKind.NVLINK, 12)
    topology = {(0, 1): nv, (1, 2): nv}  # 0-1-2 one island by transitivity; 3 alone
    components = nvlink_components([0, 1, 2, 3], topology)
    assert components == [3, 1]
    assert stranded_gpus(components, sizes) == expected


def test_room_beside_counts_placements_not_slices_divided_by_size(a100: MigGeometry) -> None:
    geo = a100
    # 8 memory slices, but a 1g.5gb may start only at slices 0-6: room for 7, not 8.
    assert room_beside(geo, (), "1g.5gb") == 7
    # A held 1g anywhere leaves room for 6 more (the profile's maximum is 7).
    assert room_beside(geo, ("1g.5gb",), "1g.5gb") == 6
    # A held 3g (4 slices) leaves 4 slices, and a 3g.20gb fits beside another only at 0 and 4.
    assert room_beside(geo, ("3g.20gb",), "3g.20gb") == 1
    # A held 7g leaves nothing; held instances with no legal layout leave nothing either.
    assert room_beside(geo, ("7g.40gb",), "1g.5gb") == 0
    assert room_beside(geo, ("4g.20gb", "4g.20gb"), "1g.5gb") == 0
    assert room_beside(geo, (), "9g.99gb") == 0
