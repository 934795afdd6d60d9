"""The model catalog against the reference MIG tables, read back through the NVML surface."""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from nodeagent.sim import models
from nodeagent.sim.nvml import SimNvml

# name, profile ID, NVML index constant, memory slices, SMs, memory MiB, max count, CE/DEC/JPG/OFA
A100_40 = [
    ("1g.5gb", 19, 0x0, 1, 14, 4864, 7, (1, 0, 0, 0)),
    ("1g.5gb+me", 20, 0x7, 1, 14, 4864, 1, (1, 1, 1, 1)),
    ("1g.10gb", 15, 0x9, 2, 14, 9856, 4, (1, 1, 0, 0)),
    ("2g.10gb", 14, 0x1, 2, 28, 9856, 3, (2, 1, 0, 0)),
    ("3g.20gb", 9, 0x2, 4, 42, 19968, 2, (3, 2, 0, 0)),
    ("4g.20gb", 5, 0x3, 4, 56, 19968, 1, (4, 2, 0, 0)),
    ("7g.40gb", 0, 0x4, 8, 98, 40192, 1, (7, 5, 1, 1)),
]
A100_80 = [
    ("1g.10gb", 19, 0x0, 1, 14, 9856, 7, (1, 0, 0, 0)),
    ("1g.10gb+me", 20, 0x7, 1, 14, 9856, 1, (1, 1, 1, 1)),
    ("1g.20gb", 15, 0x9, 2, 14, 19968, 4, (1, 1, 0, 0)),
    ("2g.20gb", 14, 0x1, 2, 28, 19968, 3, (2, 1, 0, 0)),
    ("3g.40gb", 9, 0x2, 4, 42, 40192, 2, (3, 2, 0, 0)),
    ("4g.40gb", 5, 0x3, 4, 56, 40192, 1, (4, 2, 0, 0)),
    ("7g.80gb", 0, 0x4, 8, 98, 80384, 1, (7, 5, 1, 1)),
]
H100_80 = [
    ("1g.10gb", 19, 0x0, 1, 16, 9984, 7, (1, 1, 1, 0)),
    ("1g.10gb+me", 20, 0x7, 1, 16, 9984, 1, (1, 1, 1, 1)),
    ("1g.20gb", 15, 0x9, 2, 26, 19968, 4, (1, 1, 1, 0)),
    ("2g.20gb", 14, 0x1, 2, 32, 20096, 3, (2, 2, 2, 0)),
    ("3g.40gb", 9, 0x2, 4, 60, 40448, 2, (3, 3, 3, 0)),
    ("4g.40gb", 5, 0x3, 4, 64, 40448, 1, (4, 4, 4, 0)),
    ("7g.80gb", 0, 0x4, 8, 132, 81152, 1, (8, 7, 7, 1)),
]
H100_NVL = [
    ("1g.12gb", 19, 0x0, 1, 16, 11776, 7, (1, 1, 1, 0)),
    ("1g.12gb+me", 20, 0x7, 1, 16, 11776, 1, (1, 1, 1, 1)),
    ("1g.24gb", 15, 0x9, 2, 26, 23808, 4, (1, 1, 1, 0)),
    ("2g.24gb", 14, 0x1, 2, 32, 23808, 3, (2, 2, 2, 0)),
    ("3g.47gb", 9, 0x2, 4, 60, 47616, 2, (3, 3, 3, 0)),
    ("4g.47gb", 5, 0x3, 4, 64, 47616, 1, (4, 4, 4, 0)),
    ("7g.94gb", 0, 0x4, 8, 132, 95360, 1, (8, 7, 7, 1)),
]
H200 = [
    ("1g.18gb", 19, 0x0, 1, 16, 16384, 7, (1, 1, 1, 0)),
    ("1g.18gb+me", 20, 0x7, 1, 16, 16384, 1, (1, 1, 1, 1)),
    ("1g.35gb", 15, 0x9, 2, 26, 33024, 4, (1, 1, 1, 0)),
    ("2g.35gb", 14, 0x1, 2, 32, 33024, 3, (2, 2, 2, 0)),
    ("3g.71gb", 9, 0x2, 4, 60, 71168, 2, (3, 3, 3, 0)),
    ("4g.71gb", 5, 0x3, 4, 64, 71168, 1, (4, 4, 4, 0)),
    ("7g.141gb", 0, 0x4, 8, 132, 143360, 1, (8, 7, 7, 1)),
]
A30 = [
    ("1g.6gb", 14, 0x0, 1, 14, 5952, 4, (1, 0, 0, 0)),
    ("1g.6gb+me", 21, 0x7, 1, 14, 5952, 1, (1, 1, 1, 1)),
    ("2g.12gb", 5, 0x1, 2, 28, 11968, 2, (2, 2, 0, 0)),
    ("2g.12gb+me", 6, 0x8, 2, 28, 11968, 1, (2, 2, 1, 1)),
    ("4g.24gb", 0, 0x3, 4, 56, 24000, 1, (4, 4, 1, 1)),
]

EIGHT_SLICE_STARTS = {
    19: (0, 1, 2, 3, 4, 5, 6),
    20: (0, 1, 2, 3, 4, 5, 6),
    15: (0, 2, 4, 6),
    14: (0, 2, 4),
    9: (0, 4),
    5: (0,),
    0: (0,),
}
A30_STARTS = {14: (0, 1, 2, 3), 21: (0, 1, 2, 3), 5: (0, 2), 6: (0, 2), 0: (0,)}

MIG_MODELS = [
    pytest.param("a100-40", "dgx-a100", A100_40, EIGHT_SLICE_STARTS, id="A100-SXM4-40GB"),
    pytest.param("a100-80", "dgx-a100-80", A100_80, EIGHT_SLICE_STARTS, id="A100-SXM4-80GB"),
    pytest.param("h100-80", "dgx-h100", H100_80, EIGHT_SLICE_STARTS, id="H100-80GB"),
    pytest.param("h100-nvl", "pcie-h100nvl", H100_NVL, EIGHT_SLICE_STARTS, id="H100-NVL"),
    pytest.param("h200", "hgx-h200", H200, EIGHT_SLICE_STARTS, id="H200"),
    pytest.param("a30", "a30x4", A30, A30_STARTS, id="A30"),
]


@pytest.mark.parametrize(("key", "preset", "table", "starts"), MIG_MODELS)
def test_catalog_profiles_match_reference(key, preset, table, starts):
    model = models.model(key)
    assert [p.name for p in model.gi_profiles] == [row[0] for row in table]
    for name, pid, index, slices, sms, mib, max_count, engines in table:
        profile = model.profile_by_name(name)
        assert profile is not None
        got = (profile.profile_id, profile.nvml_index, profile.slices, profile.multiprocessors,
               profile.memory_mib, profile.max_count)  # fmt: skip
        assert got == (pid, index, slices, sms, mib, max_count), name
        assert (profile.copy_engines, profile.decoders, profile.jpeg, profile.ofa) == engines
        assert profile.starts == starts[pid], name
        assert profile.memory_mib < model.memory_mib


@pytest.mark.parametrize(("key", "preset", "table", "starts"), MIG_MODELS)
def test_profile_info_through_nvml(make_sim: Callable[..., SimNvml], key, preset, table, starts):
    sim = make_sim(preset)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    seen = []
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = sim.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except pynvml.NVMLError_NotSupported:
            continue
        assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
        assert info.version == pynvml.nvmlGpuInstanceProfileInfo_v2
        seen.append((info.name, info.id, index, info.multiprocessorCount,
                     info.memorySizeMB, info.instanceCount))  # fmt: skip
        v1 = sim.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, version=1)
        assert isinstance(v1, pynvml.c_nvmlGpuInstanceProfileInfo_t)
        assert v1.id == info.id
        by_id = sim.nvmlDeviceGetGpuInstanceProfileInfoById(handle, info.id)
        assert by_id.memorySizeMB == info.memorySizeMB
        count = pynvml.c_uint()
        sim.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, None, count)
        array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        sim.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, array, count)
        placements = [(p.start, p.size) for p in array]
        size = next(row[3] for row in table if row[1] == info.id)
        assert placements == [(s, size) for s in starts[info.id]]
    expected = sorted((f"MIG {r[0]}", r[1], r[2], r[4], r[5], r[6]) for r in table)
    assert sorted(seen) == expected
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)


@pytest.mark.parametrize(
    ("key", "name", "mib", "device_id", "cc"),
    [
        pytest.param("a100-40", "NVIDIA A100-SXM4-40GB", 40960, 0x20B010DE, (8, 0), id="a100-40"),
        pytest.param("a100-80", "NVIDIA A100-SXM4-80GB", 81920, 0x20B210DE, (8, 0), id="a100-80"),
        pytest.param("a30", "NVIDIA A30", 24576, 0x20B710DE, (8, 0), id="a30"),
        pytest.param("h100-80", "NVIDIA H100 80GB HBM3", 81559, 0x233010DE, (9, 0), id="h100"),
        pytest.param("h100-nvl", "NVIDIA H100 NVL", 95830, 0x232110DE, (9, 0), id="h100-nvl"),
        pytest.param("h200", "NVIDIA H200", 143771, 0x233510DE, (9, 0), id="h200"),
        pytest.param("l40s", "NVIDIA L40S", 46068, 0x26B910DE, (8, 9), id="l40s"),
        pytest.param("t4", "Tesla T4", 15360, 0x1EB810DE, (7, 5), id="t4"),
    ],
)
def test_model_facts(key, name, mib, device_id, cc):
    model = models.model(key)
    assert (model.name, model.memory_mib, model.pci_device_id, model.compute_capability) == (
        name, mib, device_id, cc)  # fmt: skip
    assert model.mig_capable == (key not in ("l40s", "t4"))


@pytest.mark.parametrize(
    ("gi_slices", "ci_rows"),
    [
        pytest.param(1, [(0, 1, 1)], id="1g"),
        pytest.param(2, [(0, 1, 2), (1, 2, 1)], id="2g"),
        pytest.param(3, [(0, 1, 3), (1, 2, 1), (2, 3, 1)], id="3g"),
        pytest.param(4, [(0, 1, 4), (1, 2, 2), (3, 4, 1)], id="4g-has-no-3c"),
        pytest.param(7, [(0, 1, 7), (1, 2, 3), (2, 3, 2), (3, 4, 1), (4, 7, 1)], id="7g"),
    ],
)
def test_compute_instance_profiles(gi_slices, ci_rows):
    gi = next(p for p in models.A100_40.gi_profiles if p.compute_slices == gi_slices)
    got = [(c.profile_id, c.slices, c.max_count) for c in models.ci_profiles(gi)]
    assert got == ci_rows


def test_unknown_model_key_names_the_known_ones():
    with pytest.raises(KeyError, match="a100-40"):
        models.model("v100")


def test_gi_instance_ids_follow_the_slice_tree():
    # 1g instances at slots 0..6 get IDs 7..13, as real H100 output shows.
    assert [models.gi_instance_id(8, s, 1) for s in range(7)] == list(range(7, 14))
    assert models.gi_instance_id(8, 0, 8) == 0
    assert (models.gi_instance_id(8, 0, 4), models.gi_instance_id(8, 4, 4)) == (1, 2)
    assert [models.gi_instance_id(8, s, 2) for s in (0, 2, 4, 6)] == [3, 4, 5, 6]
