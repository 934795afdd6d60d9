"""MIG semantics of the simulator: modes, placement heuristic, capacity, IN_USE, IDs, handles."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from nodeagent.sim.control import SimControl, SimError
from nodeagent.sim.nvml import SimNvml
from nodeagent.sim.ops import default_start
from tests.sim.conftest import enable_mig

CI_FULL = {19: 0, 20: 0, 15: 0, 14: 1, 9: 2, 5: 3, 0: 4}  # CI profile spanning each GI (A100)


def _placement(sim: SimNvml, gi) -> tuple[int, int]:
    info = sim.nvmlGpuInstanceGetInfo(gi)
    return info.placement.start, info.placement.size


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100"])
@pytest.mark.parametrize(
    ("profiles", "expected"),
    [
        pytest.param([9, 9], [(4, 4), (0, 4)], id="9,9"),
        pytest.param([19] * 7, [(6, 1), (4, 1), (5, 1), (0, 1), (1, 1), (2, 1), (3, 1)], id="19x7"),
        pytest.param([9, 14], [(4, 4), (0, 2)], id="9,14: the 2g at 0:2"),
        pytest.param([9, 19, 14, 19], [(4, 4), (0, 1), (2, 2), (1, 1)], id="9,19,14,19"),
        pytest.param(
            [14, 19, 19, 19, 19, 19],
            [(4, 2), (6, 1), (0, 1), (1, 1), (2, 1), (3, 1)],
            id="14,19x5",
        ),
        pytest.param([5, 9], [(0, 4), (4, 4)], id="4g-then-3g"),
        pytest.param([15, 15, 15, 15], [(6, 2), (4, 2), (0, 2), (2, 2)], id="1g.2x-x4"),
    ],
)
def test_placement_heuristic_reproduces_user_guide(make_sim, preset, profiles, expected):
    sim = make_sim(preset)
    handle = enable_mig(sim)
    got = [_placement(sim, sim.nvmlDeviceCreateGpuInstance(handle, p)) for p in profiles]
    assert got == expected


@pytest.mark.parametrize(
    ("starts", "size", "taken", "expected"),
    [
        pytest.param(range(7), 1, [], 6, id="1g: slot 6 first"),
        pytest.param(range(7), 1, [(6, 1)], 4, id="1g: then the upper half from the bottom"),
        pytest.param(range(7), 1, [(4, 4)], 0, id="1g: upper half full, lowest free"),
        pytest.param(range(7), 1, [(6, 2), (0, 4)], 4, id="1g: lowest free beside others"),
        pytest.param((4, 0), 4, [], 4, id="3g: upper half first, starts in any order"),
        pytest.param((0, 4), 4, [(5, 1)], 0, id="3g: lower half when the upper is taken"),
        pytest.param((0, 2, 4), 2, [], 4, id="2g: upper half first"),
        pytest.param((0, 2, 4), 2, [(4, 4)], 0, id="2g: then from the bottom"),
        pytest.param((0, 2, 4, 6), 2, [(0, 8)], None, id="nothing free"),
        pytest.param((0, 1, 2, 3), 1, [], 3, id="4-slice part: last slot"),
        pytest.param((0, 1, 2, 3), 1, [(3, 1)], 2, id="4-slice part: then slot 2"),
    ],
)
def test_default_start(starts, size, taken, expected):
    """The pure heuristic behind nvmlDeviceCreateGpuInstance without a placement."""
    assert default_start(tuple(starts), size, taken) == expected


def test_placement_heuristic_19_19_14_9_fails_on_the_3g(make_sim):
    sim = make_sim("dgx-a100")
    handle = enable_mig(sim)
    placed = [_placement(sim, sim.nvmlDeviceCreateGpuInstance(handle, p)) for p in (19, 19, 14)]
    assert placed == [(6, 1), (4, 1), (0, 2)]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        sim.nvmlDeviceCreateGpuInstance(handle, 9)


@pytest.mark.parametrize(
    ("existing", "profile", "placement", "error"),
    [
        pytest.param([(9, 0)], 14, (2, 2), pynvml.NVMLError_InsufficientResources, id="overlap"),
        pytest.param([], 9, (2, 4), pynvml.NVMLError_InvalidArgument, id="illegal-start"),
        pytest.param([], 14, (0, 4), pynvml.NVMLError_InvalidArgument, id="wrong-size"),
        pytest.param(
            [(20, 0)], 20, (1, 1), pynvml.NVMLError_InsufficientResources, id="max-count-of-+me"
        ),
        pytest.param([(0, 0)], 19, (0, 1), pynvml.NVMLError_InsufficientResources, id="7g-full"),
        pytest.param([], 77, (0, 1), pynvml.NVMLError_InvalidArgument, id="unknown-profile"),
    ],
)
def test_create_with_placement_errors(make_sim, existing, profile, placement, error):
    sim = make_sim("dgx-a100")
    handle = enable_mig(sim)
    for pid, start in existing:
        size = {19: 1, 20: 1, 15: 2, 14: 2, 9: 4, 5: 4, 0: 8}[pid]
        sim.nvmlDeviceCreateGpuInstanceWithPlacement(
            handle, pid, pynvml.c_nvmlGpuInstancePlacement_t(start, size)
        )
    with pytest.raises(error):
        sim.nvmlDeviceCreateGpuInstanceWithPlacement(
            handle, profile, pynvml.c_nvmlGpuInstancePlacement_t(*placement)
        )


def test_remaining_capacity_tracks_free_placements(make_sim):
    sim = make_sim("dgx-h100")
    handle = enable_mig(sim)
    cap = sim.nvmlDeviceGetGpuInstanceRemainingCapacity
    assert (cap(handle, 19), cap(handle, 9), cap(handle, 0), cap(handle, 15)) == (7, 2, 1, 4)
    sim.nvmlDeviceCreateGpuInstanceWithPlacement(
        handle, 19, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(6, 1))
    )
    # A 1g at slot 6 blocks 1g.2x@6 and 3g@4 (the notes' consequence), and the 7g.
    assert (cap(handle, 19), cap(handle, 9), cap(handle, 0), cap(handle, 15)) == (6, 1, 0, 3)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s, h: s.nvmlDeviceCreateGpuInstance(h, 19), id="create"),
        pytest.param(lambda s, h: s.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19), id="cap"),
        pytest.param(lambda s, h: s.nvmlDeviceGetGpuInstanceById(h, 7), id="by-id"),
        pytest.param(lambda s, h: s.nvmlDeviceGetMigDeviceHandleByIndex(h, 0), id="mig-handle"),
    ],
)
@pytest.mark.parametrize("preset", ["dgx-a100", "t4", "pcie-l40s"])
def test_mig_calls_without_mig_are_not_supported(make_sim, call, preset):
    sim = make_sim(preset)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        call(sim, handle)


@pytest.mark.parametrize("preset", ["t4", "pcie-l40s"])
def test_non_mig_gpu_rejects_mode_and_profiles(make_sim, preset):
    sim = make_sim(preset)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    for call in (
        lambda: sim.nvmlDeviceGetMigMode(handle),
        lambda: sim.nvmlDeviceSetMigMode(handle, 1),
        lambda: sim.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100"])
def test_mig_mode_applies_at_once_on_an_idle_gpu(make_sim, control_for, preset):
    sim = make_sim(preset)
    control_for(sim).add_process(1)
    handle, busy = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceSetMigMode(handle, 1) == pynvml.NVML_SUCCESS
    assert sim.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert sim.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
    # A client holds GPU 1: activation fails and the mode waits, as "pending enable".
    assert sim.nvmlDeviceSetMigMode(busy, 1) == pynvml.NVML_ERROR_IN_USE
    assert sim.nvmlDeviceGetMigMode(busy) == [0, 1]
    sim.nvmlDeviceSetMigMode(handle, 0)
    assert sim.nvmlDeviceGetMigMode(handle) == [0, 0]


def test_mig_mode_is_pending_until_reset(make_sim, control_for):
    sim = make_sim("dgx-a100")
    assert control_for(sim).set_semantics(mig_mode_applies_at_once=False) == {
        "mig_mode_applies_at_once": False,
        "profile_info_needs_mig": True,
    }
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceSetMigMode(handle, 1) == pynvml.NVML_SUCCESS
    assert sim.nvmlDeviceGetMigMode(handle) == [0, 1]
    assert sim.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
    sim.sim_reset_gpu(0)
    assert sim.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert sim.nvmlDeviceGetMaxMigDeviceCount(handle) == 7


def test_reset_with_processes_is_in_use_and_keeps_the_pending_mode(make_sim, control_for):
    sim = make_sim("dgx-a100")
    control: SimControl = control_for(sim)
    pid = control.add_process(0)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceSetMigMode(handle, 1) == pynvml.NVML_ERROR_IN_USE
    with pytest.raises(pynvml.NVMLError_InUse):
        sim.sim_reset_gpu(0)
    assert sim.nvmlDeviceGetMigMode(handle) == [0, 1]
    control.remove_process(pid)
    sim.sim_reset_gpu(0)
    assert sim.nvmlDeviceGetMigMode(handle) == [1, 1]


def test_instances_vanish_on_reset_and_stale_handles_fail(make_sim):
    sim = make_sim("dgx-a100")
    handle = enable_mig(sim)
    gi = sim.nvmlDeviceCreateGpuInstance(handle, 9)
    sim.sim_reset_gpu(0)
    assert sim.nvmlDeviceGetMigMode(handle) == [1, 1]
    count = ctypes.c_uint()
    sim.nvmlDeviceGetGpuInstances(handle, 9, None, count)
    assert count.value == 0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlGpuInstanceGetInfo(gi)
    # Re-created at the same place with the same ID, the old handle still does not work.
    sim.nvmlDeviceCreateGpuInstance(handle, 9)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlGpuInstanceGetInfo(gi)


def test_destroy_order_and_in_use(make_sim, control_for):
    sim = make_sim("dgx-a100")
    handle = enable_mig(sim)
    gi = sim.nvmlDeviceCreateGpuInstance(handle, 14)
    ci = sim.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    with pytest.raises(pynvml.NVMLError_InUse):
        sim.nvmlGpuInstanceDestroy(gi)  # a compute instance still lives in it
    mig_uuid = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0))
    pid = control_for(sim).add_process(0, mig_uuid=mig_uuid)
    with pytest.raises(pynvml.NVMLError_InUse):
        sim.nvmlComputeInstanceDestroy(ci)
    control_for(sim).remove_process(pid)
    sim.nvmlComputeInstanceDestroy(ci)
    sim.nvmlGpuInstanceDestroy(gi)
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 0) == 1


def test_gpu_instance_listing_fills_caller_arrays(make_sim):
    sim = make_sim("dgx-a100")
    handle = enable_mig(sim)
    for _ in range(3):
        sim.nvmlDeviceCreateGpuInstance(handle, 19)
    info = sim.nvmlDeviceGetGpuInstanceProfileInfoById(handle, 19)
    array = (pynvml.c_nvmlGpuInstance_t * info.instanceCount)()
    count = ctypes.c_uint()
    assert sim.nvmlDeviceGetGpuInstances(handle, 19, array, ctypes.byref(count)) == 0
    got = sorted(
        (sim.nvmlGpuInstanceGetInfo(array[i]).id, _placement(sim, array[i]))
        for i in range(count.value)
    )
    assert got == [(7, (6, 1)), (8, (4, 1)), (9, (5, 1))]  # IDs in creation order
    small = (pynvml.c_nvmlGpuInstance_t * 1)()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        sim.nvmlDeviceGetGpuInstances(handle, 19, small, count)
    assert count.value == 3
    by_id = sim.nvmlDeviceGetGpuInstanceById(handle, 7)
    assert _placement(sim, by_id) == (6, 1)
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetGpuInstanceById(handle, 2)


def test_compute_instances_and_mig_devices(make_sim):
    sim = make_sim("dgx-a100")
    handle = enable_mig(sim)
    gi = sim.nvmlDeviceCreateGpuInstance(handle, 9)  # 3g.20gb at 4:4
    one = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
    info = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, one, 0)
    assert (info.name, info.instanceCount, info.multiprocessorCount) == ("1c.3g.20gb", 3, 14)
    cis = [sim.nvmlGpuInstanceCreateComputeInstance(gi, one) for _ in range(3)]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        sim.nvmlGpuInstanceCreateComputeInstance(gi, one)
    got = [(i.id, i.placement.start) for i in map(sim.nvmlComputeInstanceGetInfo, cis)]
    assert got == [(0, 0), (1, 1), (2, 2)]
    assert sim.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, one) == 0
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(handle, 2)
    assert sim.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert not sim.nvmlDeviceIsMigDeviceHandle(handle)
    assert (sim.nvmlDeviceGetGpuInstanceId(mig), sim.nvmlDeviceGetComputeInstanceId(mig)) == (1, 2)
    assert sim.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb"
    mig_uuid = sim.nvmlDeviceGetUUID(mig)
    assert mig_uuid.startswith("MIG-")
    parent = sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert sim.nvmlDeviceGetIndex(parent) == 0
    assert sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByUUID(mig_uuid)) == mig_uuid
    assert sim.nvmlDeviceGetMemoryInfo(mig).total == 19968 * 1024 * 1024
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetMigDeviceHandleByIndex(handle, 3)


def test_a30_has_four_slices(make_sim):
    sim = make_sim("a30x4")
    handle = enable_mig(sim)
    assert sim.nvmlDeviceGetMaxMigDeviceCount(handle) == 4
    gis = [sim.nvmlDeviceCreateGpuInstance(handle, 14) for _ in range(4)]
    assert sorted(_placement(sim, gi)[0] for gi in gis) == [0, 1, 2, 3]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        sim.nvmlDeviceCreateGpuInstance(handle, 14)


def test_errors_are_pynvml_classes(make_sim):
    sim = make_sim("t4")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError) as caught:
        sim.nvmlDeviceGetMigMode(handle)
    assert type(caught.value) is pynvml.nvmlExceptionClass(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert caught.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert sim.NVMLError_InUse is pynvml.NVMLError_InUse
    assert sim.c_nvmlGpuInstancePlacement_t is pynvml.c_nvmlGpuInstancePlacement_t
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetFanSpeed(handle)  # in pynvml, not modelled
    with pytest.raises(AttributeError):
        _ = sim.nvmlNoSuchFunction


@pytest.mark.parametrize(
    ("placements", "expected"),
    [
        pytest.param([None, None], [(1, (4, 4)), (2, (0, 4))], id="default: 4:4 first gets ID 1"),
        pytest.param([0, 4], [(1, (0, 4)), (2, (4, 4))], id="explicit: 0:4 first gets ID 1"),
        pytest.param([4, 0], [(1, (4, 4)), (2, (0, 4))], id="explicit: 4:4 first gets ID 1"),
    ],
)
def test_gpu_instance_ids_follow_creation_not_placement(make_sim, placements, expected):
    """A100-80GB on 550.54.14: the 3g made first took ID 1 at 4:4, the second ID 2 at 0:4."""
    sim = make_sim("dgx-a100-80")
    handle = enable_mig(sim)
    made = []
    for start in placements:
        if start is None:
            made.append(sim.nvmlDeviceCreateGpuInstance(handle, 9))
        else:
            placement = pynvml.c_nvmlGpuInstancePlacement_t(start, 4)
            made.append(sim.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, placement))
    got = [(sim.nvmlGpuInstanceGetInfo(gi).id, _placement(sim, gi)) for gi in made]
    assert got == expected


def test_freed_gpu_instance_id_is_reused(make_sim):
    sim = make_sim("dgx-h100")
    handle = enable_mig(sim)
    first, _second = (sim.nvmlDeviceCreateGpuInstance(handle, 19) for _ in range(2))
    sim.nvmlGpuInstanceDestroy(first)  # ID 7 at 6:1 is free again
    again = sim.nvmlDeviceCreateGpuInstance(handle, 19)
    assert (sim.nvmlGpuInstanceGetInfo(again).id, _placement(sim, again)) == (7, (6, 1))


@pytest.mark.parametrize(
    ("preset", "first", "second"),
    [
        pytest.param("a30x4", 21, 6, id="A30: 1g.6gb+me then 2g.12gb+me"),
        pytest.param("a30x4", 6, 21, id="A30: 2g.12gb+me then 1g.6gb+me"),
    ],
)
def test_two_media_engine_instances_cannot_coexist(make_sim, preset, first, second):
    """The A30 has one JPEG and one OFA: a second "+me" instance finds none left."""
    sim = make_sim(preset)
    handle = enable_mig(sim)
    sim.nvmlDeviceCreateGpuInstance(handle, first)
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, second) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        sim.nvmlDeviceCreateGpuInstance(handle, second)
    # Plain profiles beside it are not limited by the engines.
    plain = 14 if second == 21 else 5
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, plain) >= 1


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200"])
def test_media_engines_never_limit_plain_layouts(make_sim, preset):
    """Seven 1g, four 1g.2x, or 4g+3g: the engine pool only ever binds the "+me" profiles."""
    for layout in ([19] * 7, [15] * 4, [5, 9], [20, 19, 19, 19, 19, 19, 19]):
        sim = make_sim(preset)
        handle = enable_mig(sim)
        for pid in layout:
            sim.nvmlDeviceCreateGpuInstance(handle, pid)
        assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 20) == 0


def _ci_profile_info(sim, gi_profile, ci_profile):
    """GPU 0 with MIG on and a new GPU instance of ``gi_profile``: the GPU's handle, the GPU
    instance and the info of compute-instance profile ``ci_profile`` in it."""
    handle = enable_mig(sim)
    gi = sim.nvmlDeviceCreateGpuInstance(handle, gi_profile)
    return handle, gi, sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile, 0)


def test_one_slice_double_memory_gi_offers_ci_profile_rev1(make_sim):
    """H100: a 1g.20gb GPU instance takes compute-instance profile 7 (1_SLICE_REV1)."""
    rev1 = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1
    sim = make_sim("dgx-h100")
    handle, gi, info = _ci_profile_info(sim, 15, rev1)
    assert (info.id, info.sliceCount, info.name) == (7, 1, "1g.20gb")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0
        )
    ci = sim.nvmlGpuInstanceCreateComputeInstance(gi, rev1)
    assert sim.nvmlComputeInstanceGetInfo(ci).profileId == 7
    # A plain 1g keeps profile 0.
    plain = sim.nvmlDeviceCreateGpuInstance(handle, 19)
    one = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
    assert sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(plain, one, 0).id == 0


def test_ampere_whole_gpu_gi_lists_the_nvl_ci_profile(make_sim):
    nvl = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL
    _, _, info = _ci_profile_info(make_sim("dgx-a100"), 0, nvl)
    assert (info.id, info.sliceCount) == (nvl, 7)


@pytest.mark.parametrize("preset", ["t4", "pcie-l40s"])
def test_max_mig_device_count_is_zero_without_mig(make_sim, preset):
    sim = make_sim(preset)
    assert sim.nvmlDeviceGetMaxMigDeviceCount(sim.nvmlDeviceGetHandleByIndex(0)) == 0


def test_profile_info_with_mig_disabled_follows_the_semantics(make_sim, control_for):
    sim = make_sim("dgx-h100")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    # The default is the driver's: profile info (every entry point) is NOT_SUPPORTED while MIG
    # is disabled (nvml.h), and the placements stay readable whatever the mode (the NVML 13
    # reference says so in as many words).
    for call in (
        lambda: sim.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0),
        lambda: sim.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0, version=1),
        lambda: sim.nvmlDeviceGetGpuInstanceProfileInfoV(handle, 0),
        lambda: sim.nvmlDeviceGetGpuInstanceProfileInfoById(handle, 19),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    count = ctypes.c_uint()
    sim.nvmlDeviceGetGpuInstancePossiblePlacements(handle, 19, None, ctypes.byref(count))
    assert count.value == 7
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 19)
    # Switched off, the tables can be read in either mode, as older simulated nodes did.
    control_for(sim).set_semantics(profile_info_needs_mig=False)
    assert sim.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0).id == 19
    control_for(sim).set_semantics(profile_info_needs_mig=True)
    enable_mig(sim)
    assert sim.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0).id == 19


def test_unknown_semantics_is_refused(make_sim, control_for):
    sim = make_sim("dgx-h100")
    with pytest.raises(SimError, match="unknown semantics"):
        control_for(sim).set_semantics(reset_takes_a_minute=True)
