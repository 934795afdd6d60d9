"""The model catalog against the reference MIG tables, read back through the NVML surface."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest
import yaml

from nodeagent import migcatalog
from nodeagent.sim import models, presets
from nodeagent.sim.nvml import SimNvml
from tests.sim.conftest import enable_mig

# The published readings, in a file of their own (never the catalog's): see its header.
PUBLISHED = yaml.safe_load((Path(__file__).parent / "published_profiles.yaml").read_text())


def eight_slice(names, sms, mib, engines):
    """The rows of an 8-slice part from its own columns, one per name (the first ``len(names)``
    profiles where only those are published)."""
    return [
        (name, pid, index, slices, sm, memory, count, tuple(engine))
        for name, (pid, index, slices, count), sm, memory, engine in zip(
            names, PUBLISHED["eight_slice"], sms, mib, engines, strict=False
        )
    ]


def published_rows(table):
    """A published table as rows: name, profile ID, NVML index constant, memory slices, SMs,
    memory MiB, max count, CE/DEC/JPG/OFA."""
    if "rows" in table:
        return [(*row[:7], tuple(row[7])) for row in table["rows"]]
    sms, engines = table["sms"], table["engines"]
    return eight_slice(
        table["names"],
        PUBLISHED["sms"][sms] if isinstance(sms, str) else sms,
        table["mib"],
        PUBLISHED["engines"][engines] if isinstance(engines, str) else engines,
    )


def published(partly):
    return [
        pytest.param(
            key,
            t["preset"],
            published_rows(t),
            {pid: tuple(s) for pid, s in PUBLISHED["starts"][t["starts"]].items()},
            id=t["id"],
        )
        for key, t in PUBLISHED["tables"].items()
        if t.get("partly", False) == partly
    ]


MIG_MODELS = published(partly=False)
# B200 and GB200: only the published rows are pinned (the rest is inferred, see SOURCES).
PARTLY_PUBLISHED = published(partly=True)
NAMES = PUBLISHED["names"]


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
    ("key", "product"), PUBLISHED["products"].items(), ids=list(PUBLISHED["products"])
)
def test_model_facts(key, product):
    model = models.model(key)
    got = (model.name, model.memory_mib, model.pci_device_id, model.compute_capability)
    assert got == (product["name"], product["mib"], product["device_id"], tuple(product["cc"]))
    assert model.mig_capable == product["mig"]


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


# The catalog files as shipped, each with its reader, to break one key at a time.
CATALOG_FILES = {
    "mig": (migcatalog.read_catalog, Path(migcatalog.__file__).with_name("migcatalog.yaml")),
    "models": (models.read_catalog, Path(models.__file__).with_name("models.yaml")),
}


MALFORMED = yaml.safe_load((Path(__file__).parent / "malformed_catalogs.yaml").read_text())


@pytest.mark.parametrize("case", MALFORMED, ids=[case["id"] for case in MALFORMED])
def test_a_malformed_catalog_file_names_the_file_and_key(case):
    read, path = CATALOG_FILES[case["file"]]
    text = path.read_text()
    assert case["old"] in text
    with pytest.raises(migcatalog.CatalogError, match=rf"^bad\.yaml: .*{case['message']}"):
        read("bad.yaml", text.replace(case["old"], case["new"], 1))
