"""The model catalog against the reference MIG tables, read back through the NVML surface."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from nodeagent import migcatalog
from nodeagent.sim import models, presets
from nodeagent.sim.nvml import SimNvml
from tests.sim.conftest import enable_mig

# Published GPU-instance profile rows: name, profile ID, NVML index constant, memory slices, SMs,
# memory MiB (lgip GiB to the 1/8 GiB), max count, CE/DEC/JPG/OFA. Each table names its source;
# models.SOURCES says the same for the catalog.
# The columns every 8-slice part shows alike in lgip (A100, H100, H200, B200, GB200), in lgip
# order: profile ID, NVML index constant, memory slices, max count.
EIGHT_SLICE = [(19, 0x0, 1, 7), (20, 0x7, 1, 1), (15, 0x9, 2, 4), (14, 0x1, 2, 3), (9, 0x2, 4, 2),
               (5, 0x3, 4, 1), (0, 0x4, 8, 1)]  # fmt: skip
A100_SMS = [14, 14, 14, 28, 42, 56, 98]
A100_ENGINES = [(1, 0, 0, 0), (1, 1, 1, 1), (1, 1, 0, 0), (2, 1, 0, 0), (3, 2, 0, 0), (4, 2, 0, 0),
                (7, 5, 1, 1)]  # fmt: skip
HOPPER_SMS = [16, 16, 26, 32, 60, 64, 132]
HOPPER_ENGINES = [(1, 1, 1, 0), (1, 1, 1, 1), (1, 1, 1, 0), (2, 2, 2, 0), (3, 3, 3, 0),
                  (4, 4, 4, 0), (8, 7, 7, 1)]  # fmt: skip


def eight_slice(names, sms, mib, engines):
    """The rows of an 8-slice part from its own columns, one per name (the first ``len(names)``
    profiles where only those are published)."""
    return [
        (name, pid, index, slices, sm, memory, count, engine)
        for name, (pid, index, slices, count), sm, memory, engine in zip(
            names, EIGHT_SLICE, sms, mib, engines, strict=False
        )
    ]


# UG "Supported MIG Profiles" (A100) and lgip in "Getting Started".
A100_40 = eight_slice(
    ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    A100_SMS,
    [4864, 4864, 9856, 9856, 19968, 19968, 40192],
    A100_ENGINES,
)
# lgip on A100-SXM4-80GB: 1g.10gb 9.50 GiB, 1g.20gb/2g.20gb 19.50, 3g/4g 39.25, 7g 78.50.
A100_80 = eight_slice(
    ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    A100_SMS,
    [9728, 9728, 19968, 19968, 40192, 40192, 80384],
    A100_ENGINES,
)
# lgip on H100 80GB HBM3: 9.75 / 19.62 (1g.20gb equals 2g.20gb) / 39.50 / 79.25 GiB.
H100_80 = eight_slice(
    ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    HOPPER_SMS,
    [9984, 9984, 20096, 20096, 40448, 40448, 81152],
    HOPPER_ENGINES,
)
# lgip on H100 NVL (NVIDIA/gpu-operator#900, NVIDIA/mig-parted#101): 10.75 / 21.62 / 46.38 GiB;
# 7g 93.12 GiB (reference notes).
H100_NVL = eight_slice(
    ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    HOPPER_SMS,
    [11008, 11008, 22144, 22144, 47488, 47488, 95360],
    HOPPER_ENGINES,
)
# lgip on H200 (NVIDIA/mig-parted#120): 16.00 / 32.25 / 69.50 / 139.75 GiB.
H200 = eight_slice(
    ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    HOPPER_SMS,
    [16384, 16384, 33024, 33024, 71168, 71168, 143104],
    HOPPER_ENGINES,
)
# UG A30 table.
A30 = [
    ("1g.6gb", 14, 0x0, 1, 14, 5952, 4, (1, 0, 0, 0)),
    ("1g.6gb+me", 21, 0x7, 1, 14, 5952, 1, (1, 1, 1, 1)),
    ("2g.12gb", 5, 0x1, 2, 28, 11968, 2, (2, 2, 0, 0)),
    ("2g.12gb+me", 6, 0x8, 2, 28, 11968, 1, (2, 2, 1, 1)),
    ("4g.24gb", 0, 0x3, 4, 56, 24000, 1, (4, 4, 1, 1)),
]
# lgip on B200 (NVIDIA/mig-parted#187, 1g at 20.50 GiB): the four published rows.
B200 = eight_slice(
    ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb"],
    [18, 18, 30, 36],
    [20992, 20992, 45312, 45312],
    [(2, 1, 1, 0), (2, 1, 1, 1), (2, 1, 1, 0), (4, 2, 2, 0)],
)
# lgip on GB200 (NVIDIA/mig-parted#227, 1g.23gb at 22.00 GiB): the four published rows.
GB200 = eight_slice(
    ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb"],
    [18, 18, 32, 38],
    [22528, 22528, 46592, 46592],
    [(2, 1, 1, 0), (2, 1, 1, 1), (2, 1, 1, 0), (4, 2, 2, 0)],
)
# Names only, from mig-parted's config-default.yaml (all seven, lgip order).
NAMES = {
    "h100-pcie": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "h200-nvl": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "gh200": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
    "b200": ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
    "gb200": ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"],
}

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
# B200 and GB200: only the published rows are pinned (the rest is inferred, see SOURCES).
PARTLY_PUBLISHED = [
    pytest.param("b200", "dgx-b200", B200, EIGHT_SLICE_STARTS, id="B200"),
    pytest.param("gb200", None, GB200, EIGHT_SLICE_STARTS, id="GB200"),
]


@pytest.mark.parametrize(("key", "preset", "table", "starts"), MIG_MODELS + PARTLY_PUBLISHED)
def test_catalog_profiles_match_reference(key, preset, table, starts):
    model = models.model(key)
    assert [p.name for p in model.gi_profiles][: len(table)] == [row[0] for row in table]
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
    handle = enable_mig(sim)  # the driver lists profiles only while MIG is enabled
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
        pytest.param("h100-pcie", "NVIDIA H100 PCIe", 81559, 0x233110DE, (9, 0), id="h100-pcie"),
        pytest.param("h200-nvl", "NVIDIA H200 NVL", 143771, 0x233B10DE, (9, 0), id="h200-nvl"),
        pytest.param("gh200", "NVIDIA GH200 480GB", 97871, 0x234210DE, (9, 0), id="gh200"),
        pytest.param("b200", "NVIDIA B200", 183359, 0x290110DE, (10, 0), id="b200"),
        pytest.param("gb200", "NVIDIA GB200", 189471, 0x294110DE, (10, 0), id="gb200"),
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
        pytest.param(
            7, [(0, 1, 7), (1, 2, 3), (2, 3, 2), (3, 4, 1), (4, 7, 1), (8, 7, 1)], id="7g+nvl"
        ),
    ],
)
def test_compute_instance_profiles(gi_slices, ci_rows):
    gi = next(
        p
        for p in models.model("a100-40").gi_profiles
        if p.compute_slices == gi_slices and p.profile_id not in (15, 20)
    )
    got = [(c.profile_id, c.slices, c.max_count) for c in models.ci_profiles(gi)]
    assert got == ci_rows


def test_unknown_model_key_names_the_known_ones():
    with pytest.raises(KeyError, match="a100-40"):
        models.model("v100")


def test_gi_instance_id_ranges_and_creation_order():
    """IDs stay in the ranges every -lgi shows (1g 7-14, 3g/4g 1-2), in creation order."""
    assert [models.gi_id_range(8, n) for n in (8, 4, 2, 1)] == [
        range(0, 1), range(1, 3), range(3, 7), range(7, 15)]  # fmt: skip
    assert [models.gi_id_range(4, n) for n in (4, 2, 1)] == [range(0, 1), range(1, 3), range(3, 7)]
    assert models.gi_instance_id(8, 4, []) == 1
    assert models.gi_instance_id(8, 4, [1]) == 2
    assert models.gi_instance_id(8, 4, [1, 2]) is None
    assert models.gi_instance_id(8, 1, [7, 9, 1]) == 8


@pytest.mark.parametrize(("key", "names"), NAMES.items(), ids=list(NAMES))
def test_profile_names_match_mig_parted(key, names):
    assert [p.name for p in models.model(key).gi_profiles] == names


@pytest.mark.parametrize(
    ("driver", "name"),
    [
        pytest.param("535.104.05", "3g.39gb", id="R535"),
        pytest.param("545.23.08", "3g.39gb", id="R545 (mig-parted#31)"),
        pytest.param("550.54.14", "3g.40gb", id="R550"),
    ],
)
def test_a100_80gb_3g_profile_name_depends_on_the_driver(make_sim, control_for, driver, name):
    sim = make_sim("dgx-a100-80")
    control_for(sim).inject("driver", 0, version=driver)
    info = sim.nvmlDeviceGetGpuInstanceProfileInfo(
        enable_mig(sim), pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    )
    text = info.name.decode() if isinstance(info.name, bytes) else info.name
    assert (text, info.memorySizeMB) == (f"MIG {name}", 40192)


@pytest.mark.parametrize("key", list(models.MODELS))
def test_every_fact_names_its_source(key):
    model = models.model(key)
    facts = models.SOURCES[key]
    wanted = set(models.FACTS) | (set(models.MIG_FACTS) if model.mig_capable else set())
    assert wanted <= set(facts), f"{key} lacks a source for {sorted(wanted - set(facts))}"
    for fact, text in facts.items():
        assert len(text) > 20, (key, fact)


def test_docs_list_every_inferred_fact():
    docs = (Path(__file__).parents[2] / "docs" / "simulator.md").read_text()
    missing = [
        (key, fact)
        for key, fact, _ in models.inferred_facts()
        if f"| `{key}` | {fact} |" not in docs
    ]
    assert not missing, f"docs/simulator.md does not list these inferred facts: {missing}"


@pytest.mark.parametrize(
    ("key", "thresholds", "reserved"),
    [
        pytest.param("h100-80", (89, 92, 87), 336, id="H100: HAMi#338; 550.90.07"),
        pytest.param("a100-40", (89, 92, 85), 571, id="A100"),
        pytest.param("a30", (97, 100, 90), 316, id="A30"),
        pytest.param("h200", (89, 92, 87), 700, id="H200: 550.90.12"),
    ],
)
def test_thresholds_and_reserved_memory(make_sim, key, thresholds, reserved):
    preset = next(p for p in presets.PRESETS.values() if p.model == key)
    sim = make_sim(preset.name)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    got = tuple(
        sim.nvmlDeviceGetTemperatureThreshold(handle, t)
        for t in (
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
        )
    )
    assert got == thresholds
    v2 = sim.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    v1 = sim.nvmlDeviceGetMemoryInfo(handle)
    assert v2.reserved == reserved * models.MIB
    assert v1.used == v2.used + v2.reserved  # the old API counts reserved memory as used
    assert v1.free == v2.free == v1.total - v1.used
    assert v1.total == v2.total == models.model(key).memory_mib * models.MIB


@pytest.mark.parametrize("key", [k for k, m in models.MODELS.items() if m.mig_capable])
def test_the_catalog_finds_each_mig_model_by_its_pci_id_and_memory(key):
    """The GPU layer looks a MIG-disabled GPU up by what NVML reports; it must find this table."""
    model = models.model(key)
    assert migcatalog.lookup(model.pci_device_id, model.memory_mib) is model.mig
    assert model.mig is not None
    assert model.mig.key == key
