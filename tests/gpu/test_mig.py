"""MIG through GpuNode: geometry, mode changes, instance lifecycle and every NVML refusal."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent import migcatalog
from nodeagent.gpu import mig as mig_module
from nodeagent.gpu.errors import (
    GpuError,
    InsufficientResources,
    InUse,
    InvalidArgument,
    NotFound,
    NotSupported,
)
from nodeagent.gpu.mig import FULL_READ_INTERVAL_S
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import GeometrySource, MigGeometry, Placement
from nodeagent.sim.control import SimControl
from nodeagent.sim.nvml import SimNvml
from nodeagent.sim.presets import PRESETS

MakeNode = Callable[..., GpuNode]


def _mig_node(make_node: MakeNode, preset: str = "dgx-h100", gpu: int = 0) -> GpuNode:
    node = make_node(preset)
    node.set_mig_mode(gpu, True)
    node.reset_gpu(gpu)
    return node


def test_h100_geometry_matches_the_profile_table(make_node: MakeNode) -> None:
    geometry = _mig_node(make_node).mig_geometry(0)
    assert geometry is not None
    assert geometry.source is GeometrySource.DRIVER
    assert geometry.model == "NVIDIA H100 80GB HBM3"
    assert geometry.memory_slices == 8
    table = {
        p.name: (p.profile_id, p.slices, p.compute_slices, p.multiprocessors, p.max_count)
        for p in geometry.profiles
    }
    assert table == {
        "1g.10gb": (19, 1, 1, 16, 7),
        "1g.10gb+me": (20, 1, 1, 16, 1),
        "1g.20gb": (15, 2, 1, 26, 4),
        "2g.20gb": (14, 2, 2, 32, 3),
        "3g.40gb": (9, 4, 3, 60, 2),
        "4g.40gb": (5, 4, 4, 64, 1),
        "7g.80gb": (0, 8, 7, 132, 1),
    }
    three = geometry.profile("3g.40gb")
    assert three is not None
    assert three.placements == (Placement(0, 4), Placement(4, 4))
    assert three.nvml_index == 2  # NVML_GPU_INSTANCE_PROFILE_3_SLICE, not the profile ID
    one = geometry.profile("1g.10gb")
    assert one is not None
    assert [p.start for p in one.placements] == list(range(7))


def test_a30_geometry_has_four_slices(make_node: MakeNode) -> None:
    geometry = make_node("a30x4").mig_geometry(0)
    assert geometry is not None
    assert geometry.memory_slices == 4
    assert {p.name: p.profile_id for p in geometry.profiles}["4g.24gb"] == 0


def _geometry(node: GpuNode, index: int = 0) -> MigGeometry:
    geometry = node.mig_geometry(index)
    assert geometry is not None
    return geometry


MIG_PRESETS = sorted(name for name, p in PRESETS.items() if p.model in migcatalog.MODELS)


@pytest.mark.parametrize("preset", MIG_PRESETS)
def test_catalog_stands_in_while_mig_is_off_and_agrees_with_the_driver(
    make_node: MakeNode, preset: str
) -> None:
    """The driver lists profiles only while MIG is on; before that the catalog says the same."""
    node = make_node(preset)
    before = _geometry(node)
    assert before.source is GeometrySource.CATALOG
    assert before.profiles
    node.set_mig_mode(0, True)
    after = _geometry(node)
    assert after.source is GeometrySource.DRIVER
    assert dataclasses.replace(before, source=GeometrySource.DRIVER) == after


def test_mig_enabled_by_another_process_is_read_from_the_driver(
    make_node: MakeNode, sim_state_dir: Path
) -> None:
    node = make_node("dgx-h100")
    assert _geometry(node).source is GeometrySource.CATALOG
    SimControl(sim_state_dir).set_mig_mode(0, True)  # e.g. `nodeagent mig apply` in a shell
    assert _geometry(node).source is GeometrySource.DRIVER
    assert _geometry(node, 1).source is GeometrySource.CATALOG  # still off there


def test_a_driver_that_lists_profiles_with_mig_off_is_preferred(
    make_node: MakeNode, sim_state_dir: Path
) -> None:
    node = make_node("dgx-h100")
    SimControl(sim_state_dir).set_semantics(profile_info_needs_mig=False)
    geometry = _geometry(node)
    assert geometry.source is GeometrySource.DRIVER
    assert not node.info(0).mig_enabled


@pytest.mark.parametrize(
    ("driver", "name"),
    [pytest.param("535.104.05", "3g.39gb", id="R535"), pytest.param("550.54.14", "3g.40gb")],
)
def test_catalog_names_profiles_as_the_running_driver_does(
    make_node: MakeNode, sim_state_dir: Path, driver: str, name: str
) -> None:
    node = make_node("dgx-a100-80")
    SimControl(sim_state_dir).inject("driver", 0, version=driver)
    assert _geometry(node).profile(name) is not None
    node.set_mig_mode(0, True)
    assert _geometry(node).profile(name) is not None


def test_a_model_the_catalog_lacks_has_no_profiles_until_mig_is_on(
    make_node: MakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(migcatalog.MODELS, "h100-80")
    node = make_node("dgx-h100")
    geometry = _geometry(node)
    assert (geometry.profiles, geometry.source) == ((), GeometrySource.DRIVER)
    with pytest.raises(NotSupported, match=r"catalog lacks this model .*0x233010de"):
        node.create_gpu_instance(0, "3g.40gb", Placement(0, 4))
    node.set_mig_mode(0, True)
    assert _geometry(node).profile("3g.40gb") is not None


@pytest.mark.parametrize(
    ("device_id", "memory_mib", "key"),
    [
        pytest.param(0x233010DE, 81559, "h100-80", id="H100 SXM"),
        pytest.param(0x233110DE, 81559, "h100-pcie", id="H100 PCIe: own SM counts"),
        pytest.param(0x20B510DE, 81920, "a100-80", id="A100 80GB PCIe"),
        pytest.param(0x20F110DE, 40960, "a100-40", id="A100 PCIe 40GB"),
        pytest.param(0x233B10DE, 143771, "h200-nvl", id="H200 NVL"),
        pytest.param(0x233010DE, 81559 + 800, "h100-80", id="a driver's rounding"),
        pytest.param(0x233010DE, 65536, None, id="another SKU of the same id"),
        pytest.param(0x26B910DE, 46068, None, id="L40S: no MIG"),
    ],
)
def test_catalog_lookup_by_device_id_and_memory(
    device_id: int, memory_mib: int, key: str | None
) -> None:
    found = migcatalog.lookup(device_id, memory_mib)
    assert (found.key if found else None) == key


@pytest.mark.parametrize(
    "preset", [pytest.param("t4", id="t4"), pytest.param("pcie-l40s", id="l40s")]
)
def test_non_mig_gpu_refuses_every_mig_call(make_node: MakeNode, preset: str) -> None:
    node = make_node(preset)
    assert node.mig_geometry(0) is None
    assert node.mig_instances(0) == ()
    with pytest.raises(NotSupported) as caught:
        node.set_mig_mode(0, True)
    assert caught.value.function == "nvmlDeviceSetMigMode"
    assert caught.value.gpu_index == 0
    with pytest.raises(NotSupported):
        node.create_gpu_instance(0, "1g.10gb", Placement(0, 1))


def test_create_with_mig_disabled_is_not_supported(make_node: MakeNode) -> None:
    node = make_node("dgx-h100")
    with pytest.raises(NotSupported) as caught:
        node.create_gpu_instance(0, "3g.40gb", Placement(0, 4))
    assert caught.value.function == "nvmlDeviceCreateGpuInstanceWithPlacement"


def test_mode_change_is_pending_until_reset(make_node: MakeNode, sim_state_dir: Path) -> None:
    node = make_node("dgx-h100")
    # A driver that leaves the mode pending until a reset (the simulator's semantics switch).
    SimControl(sim_state_dir).set_semantics(mig_mode_applies_at_once=False)
    change = node.set_mig_mode(1, True)
    assert (change.current, change.pending, change.reset_required) == (False, True, True)
    assert change.reason
    assert "reset" in change.reason
    with pytest.raises(NotSupported):  # still off until the reset
        node.create_gpu_instance(1, "1g.10gb", Placement(0, 1))
    node.reset_gpu(1)
    info = node.info(1)
    assert (info.mig_enabled, info.mig_pending) == (True, True)
    assert not node.info(0).mig_enabled  # other GPUs untouched
    again = node.set_mig_mode(1, True)
    assert not again.reset_required
    assert again.reason is None


def test_create_lists_instance_with_compute_instance_and_mig_uuid(make_node: MakeNode) -> None:
    node = _mig_node(make_node)
    created = node.create_gpu_instance(0, "3g.40gb", Placement(4, 4))
    assert created.profile == "3g.40gb"
    assert created.profile_id == 9
    assert created.placement == Placement(4, 4)
    assert len(created.compute_instances) == 1
    ci = created.compute_instances[0]
    assert ci.slice_count == 3  # a full-size CI spans the whole GI
    assert ci.gpu_instance_id == created.instance_id
    assert ci.uuid.startswith("MIG-")
    assert created.uuid == ci.uuid
    assert not created.busy
    small = node.create_gpu_instance(0, "1g.10gb", Placement(0, 1))
    assert [g.placement.start for g in node.mig_instances(0)] == [0, 4]  # sorted by placement
    assert small.uuid != created.uuid


@pytest.mark.parametrize(
    ("existing", "profile", "placement"),
    [
        pytest.param([("3g.40gb", 0)], "1g.10gb", 2, id="overlap"),
        pytest.param([("7g.80gb", 0)], "1g.10gb", 0, id="full-gpu"),
        pytest.param([("1g.10gb+me", 0)], "1g.10gb+me", 1, id="capacity-exhausted"),
        pytest.param([("4g.40gb", 0)], "4g.40gb", 0, id="same-slot"),
    ],
)
def test_insufficient_resources(
    make_node: MakeNode, existing: list[tuple[str, int]], profile: str, placement: int
) -> None:
    node = _mig_node(make_node)
    geometry = node.mig_geometry(0)
    assert geometry is not None
    for name, start in existing:
        size = geometry.profile(name).slices  # type: ignore[union-attr]
        node.create_gpu_instance(0, name, Placement(start, size))
    size = geometry.profile(profile).slices  # type: ignore[union-attr]
    before = node.mig_instances(0)
    with pytest.raises(InsufficientResources) as caught:
        node.create_gpu_instance(0, profile, Placement(placement, size))
    assert caught.value.function == "nvmlDeviceCreateGpuInstanceWithPlacement"
    assert node.mig_instances(0) == before


@pytest.mark.parametrize(
    ("profile", "placement"),
    [
        pytest.param("3g.40gb", Placement(2, 4), id="illegal-start"),
        pytest.param("2g.20gb", Placement(0, 4), id="wrong-size"),
        pytest.param("4g.40gb", Placement(4, 4), id="4g-only-at-0"),
    ],
)
def test_invalid_placement(make_node: MakeNode, profile: str, placement: Placement) -> None:
    node = _mig_node(make_node)
    with pytest.raises(InvalidArgument):
        node.create_gpu_instance(0, profile, placement)
    assert node.mig_instances(0) == ()


def test_unknown_profile_names_the_choices(make_node: MakeNode) -> None:
    node = _mig_node(make_node)
    with pytest.raises(InvalidArgument, match=r"1g\.10gb"):
        node.create_gpu_instance(0, "1g.5gb", Placement(0, 1))


def test_busy_instance_cannot_be_destroyed(make_node: MakeNode, sim_state_dir: Path) -> None:
    node = _mig_node(make_node)
    gi = node.create_gpu_instance(0, "2g.20gb", Placement(0, 2))
    assert gi.uuid is not None
    control = SimControl(sim_state_dir)
    pid = control.add_process(0, mig_uuid=gi.uuid, used_memory_mib=2048)
    [listed] = node.mig_instances(0)
    assert listed.pids == (pid,)
    assert listed.busy
    with pytest.raises(InUse):
        node.destroy_gpu_instance(0, gi.instance_id)
    ci = gi.compute_instances[0]
    with pytest.raises(InUse) as caught:  # NVML's own refusal, on the compute instance
        node.destroy_compute_instance(0, gi.instance_id, ci.instance_id)
    assert caught.value.function == "nvmlComputeInstanceDestroy"
    assert node.mig_instances(0)[0].compute_instances == gi.compute_instances  # left whole
    control.remove_process(pid)
    node.destroy_gpu_instance(0, gi.instance_id)
    assert node.mig_instances(0) == ()


def test_destroy_compute_instance_then_gpu_instance(make_node: MakeNode) -> None:
    node = _mig_node(make_node)
    gi = node.create_gpu_instance(0, "1g.10gb", Placement(3, 1))
    ci = gi.compute_instances[0]
    node.destroy_compute_instance(0, gi.instance_id, ci.instance_id)
    [bare] = node.mig_instances(0)
    assert bare.compute_instances == ()
    assert bare.uuid is None
    node.destroy_gpu_instance(0, gi.instance_id)
    with pytest.raises(NotFound):
        node.destroy_gpu_instance(0, gi.instance_id)


def test_reset_is_blocked_by_processes_and_drops_instances(
    make_node: MakeNode, sim_state_dir: Path
) -> None:
    node = _mig_node(make_node)
    gi = node.create_gpu_instance(0, "7g.80gb", Placement(0, 8))
    control = SimControl(sim_state_dir)
    pid = control.add_process(0, mig_uuid=gi.uuid)
    with pytest.raises(InUse):
        node.reset_gpu(0)
    assert node.mig_instances(0) != ()
    control.remove_process(pid)
    node.reset_gpu(0)
    assert node.mig_instances(0) == ()
    assert node.info(0).mig_enabled  # the mode survives a reset; the instances do not


def test_mode_change_with_processes_reports_the_reason(
    make_node: MakeNode, sim_state_dir: Path
) -> None:
    node = make_node("dgx-h100")
    SimControl(sim_state_dir).add_process(2)
    change = node.set_mig_mode(2, True)
    assert change.reset_required
    assert change.reason is not None
    assert "in use" in change.reason


def test_change_made_in_another_process_is_visible(
    make_node: MakeNode, sim_state_dir: Path
) -> None:
    node = _mig_node(make_node)
    assert node.mig_instances(0) == ()
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from nodeagent.agent.backend import open_node
        from nodeagent.gpu.types import Placement
        with open_node("dgx-h100", Path({str(sim_state_dir)!r})) as node:
            print(node.create_gpu_instance(0, "3g.40gb", Placement(0, 4)).uuid)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    [instance] = node.mig_instances(0)
    assert instance.profile == "3g.40gb"
    assert instance.uuid == result.stdout.strip()


def test_errors_carry_function_and_gpu(make_node: MakeNode) -> None:
    node = _mig_node(make_node, gpu=3)
    node.create_gpu_instance(3, "7g.80gb", Placement(0, 8))
    with pytest.raises(GpuError) as caught:
        node.create_gpu_instance(3, "1g.10gb", Placement(0, 1))
    error = caught.value
    assert (error.function, error.gpu_index, error.nvml_code) == (
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        3,
        23,
    )
    assert "GPU 3" in str(error)
    assert "\n" not in str(error)


def _snapshot_instances(node: GpuNode, gpu: int) -> list[tuple[str, int, int, str | None]]:
    return [
        (gi.profile, gi.placement.start, len(gi.pids), gi.uuid)
        for gi in node.snapshot().gpus[gpu].mig_instances
    ]


def test_sampler_sees_another_programs_mig_change_on_the_next_pass(make_node: MakeNode) -> None:
    node = _mig_node(make_node)
    node.create_gpu_instance(0, "3g.40gb", Placement(0, 4))
    first = _snapshot_instances(node, 0)
    other = make_node("dgx-h100")  # a second program on the same GPUs (`nodeagent mig apply`)
    made = other.create_gpu_instance(0, "3g.40gb", Placement(4, 4))
    assert _snapshot_instances(node, 0) == [*first, ("3g.40gb", 4, 0, made.uuid)]
    other.destroy_gpu_instance(0, made.instance_id)
    assert _snapshot_instances(node, 0) == first


def test_sampler_reads_the_layout_in_full_only_when_it_changed(
    make_node: MakeNode, monkeypatch: pytest.MonkeyPatch, sim_state_dir: Path
) -> None:
    node = _mig_node(make_node)
    for start in range(7):
        node.create_gpu_instance(0, "1g.10gb", Placement(start, 1))
    full_reads: list[int] = []
    original = SimNvml.nvmlGpuInstanceGetInfo

    def counted(self: SimNvml, gi: object) -> object:
        full_reads.append(1)
        return original(self, gi)

    monkeypatch.setattr(SimNvml, "nvmlGpuInstanceGetInfo", counted)
    node.snapshot()  # the first pass reads in full
    assert len(full_reads) == 7
    for _ in range(3):
        node.snapshot()
    assert len(full_reads) == 7  # unchanged: the fingerprint alone
    uuid = node.mig_instances(0)[2].uuid
    assert uuid is not None
    pid = SimControl(sim_state_dir).add_process(0, mig_uuid=uuid, used_memory_mib=512)
    busy = node.snapshot().gpus[0].mig_instances
    assert [gi.pids for gi in busy] == [(), (), (pid,), (), (), (), ()]  # processes stay current


def test_gpu_instance_without_compute_instance_shows_within_the_full_read_bound(
    make_node: MakeNode, monkeypatch: pytest.MonkeyPatch, sim_state_dir: Path
) -> None:
    node = _mig_node(make_node)
    node.create_gpu_instance(0, "3g.40gb", Placement(0, 4))
    assert len(node.snapshot().gpus[0].mig_instances) == 1
    # Another program makes a GPU instance and no compute instance: no MIG device, so the
    # fingerprint cannot see it; the full read repeated every FULL_READ_INTERVAL_S does.
    nvml = SimNvml(sim_state_dir)
    nvml.nvmlInit()
    nvml.nvmlDeviceCreateGpuInstance(nvml.nvmlDeviceGetHandleByIndex(0), 9)  # 3g.40gb
    now = time.monotonic()
    monkeypatch.setattr(mig_module.time, "monotonic", lambda: now + FULL_READ_INTERVAL_S)
    seen = node.snapshot().gpus[0].mig_instances
    assert [(gi.profile, gi.placement.start, gi.uuid) for gi in seen][1] == ("3g.40gb", 4, None)
    nvml.nvmlShutdown()
