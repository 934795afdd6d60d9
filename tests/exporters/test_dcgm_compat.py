"""The dcgm-exporter compatibility view: families, types, labels and values on a simulated
dgx-h100 with MIG, off by default, and its table in docs/metrics.md."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.config.metrics import MetricsSection
from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.config.schema import load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import NodeSnapshot, Profiling
from nodeagent.runtime.health_source import DeviceHealth
from nodeagent.sim.control import SimControl
from nodeagent.testing.nodes import split_into
from nodeagent_exporters import dcgm_compat
from nodeagent_exporters.catalog import CATALOG
from nodeagent_exporters.podresources import Allocations, PodDevice
from nodeagent_exporters.render import Renderer, Sources

MIB = 1 << 20
GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
GPU_LABELS |= {"DCGM_FI_DRIVER_VERSION"}
POD_LABELS = {"pod", "namespace", "container"}


@dataclass(frozen=True)
class NodeView:
    """The node view the health model hands out (by shape): only XIDs matter here."""

    xid_last_s: Mapping[tuple[str, int], float] = field(default_factory=dict)
    xids_total: Mapping[tuple[str, int], int] = field(default_factory=dict)
    level: str = "stable"
    score: float = 0.0
    history_errors: int = 0


@dataclass
class FakeHealth:
    """A health source with a node view: a double for the health model's interface."""

    node: NodeView = field(default_factory=NodeView)

    def device_health(self) -> Mapping[str, DeviceHealth]:
        return {}

    def subscribe(self, callback: object) -> object:
        return lambda: None

    def node_health(self) -> NodeView:
        return self.node


@pytest.fixture
def mig_snapshot(make_node: Callable[..., GpuNode], sim_state_dir: Path) -> NodeSnapshot:
    """dgx-h100 with GPUs 0 and 1 split into 1g.10gb instances; GPU 7 fallen off the bus.

    Without GPM figures, so the profiling fields are pinned by hand where a test wants them.
    """
    node = make_node("dgx-h100")
    control = SimControl(sim_state_dir)
    split_into(node, control, (0, 1), "1g.10gb")
    control.inject("lost", 7)
    snap = node.snapshot()
    gpus = tuple(
        replace(
            g,
            profiling=None,
            mig_instances=tuple(replace(gi, profiling=None) for gi in g.mig_instances),
        )
        for g in snap.gpus
    )
    return replace(snap, gpus=gpus)


def figures(**overrides: float | None) -> Profiling:
    base: dict[str, float | None] = dict.fromkeys(Profiling.__dataclass_fields__, None)
    base.update(interval_s=1.0, graphics_active_ratio=0.75, tensor_active_ratio=0.5)
    base.update(dram_active_ratio=0.25, pcie_tx_bytes_per_second=2e9)
    base.update(pcie_rx_bytes_per_second=1e9)
    base.update(overrides)
    return Profiling(**base)  # type: ignore[arg-type]


def render(
    snap: NodeSnapshot,
    hostname: str | None = "node-a",
    health: FakeHealth | None = None,
    allocations: Allocations | None = None,
) -> str:
    renderer = Renderer(
        Sources(
            policy=PoolPolicy,
            health=lambda: health,
            allocations=lambda: allocations,
            dcgm_compat=lambda: hostname,
        )
    )
    return renderer.render(snap).body.decode()


def compat(text: str) -> dict[str, tuple[str, list[tuple[dict[str, str], float]]]]:
    """DCGM families of an exposition: name -> (type, [(labels, value)])."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("DCGM_"):
            samples = [(dict(s.labels), s.value) for s in family.samples]
            out[family.name] = (family.type, samples)
    return out


def per_gpu(samples: list[tuple[dict[str, str], float]]) -> dict[str, float]:
    return {labels["gpu"]: v for labels, v in samples}


def test_off_by_default_so_no_dcgm_family_is_served(mig_snapshot: NodeSnapshot) -> None:
    assert MetricsSection().dcgm_compat is False
    assert "DCGM_" not in render(mig_snapshot, hostname=None)


def test_the_environment_switches_it_on() -> None:
    config = load_agent_config(None, environ={"NODEAGENT_METRICS_DCGM_COMPAT": "true"})
    assert config.metrics.dcgm_compat is True


def test_families_types_and_labels_on_a_mig_node(mig_snapshot: NodeSnapshot) -> None:
    families = compat(render(mig_snapshot, health=FakeHealth()))
    # Every served field of the default file, with dcgm-exporter's type; nothing else. With
    # no GPM figures the profiling fields are absent, not zero.
    expected = {f.name: f.kind for f in dcgm_compat.SERVED if "_PROF_" not in f.name}
    assert {n: t for n, (t, _) in families.items()} == expected
    for name, (_kind, samples) in families.items():
        for labels, _value in samples:
            assert set(labels) == GPU_LABELS, name
            assert labels["Hostname"] == "node-a"
            assert labels["device"] == f"nvidia{labels['gpu']}"
            assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
            assert labels["DCGM_FI_DRIVER_VERSION"] == mig_snapshot.driver_version
    # The lost GPU's values are unknown: no series at all rather than zeros.
    temps = per_gpu(families["DCGM_FI_DEV_GPU_TEMP"][1])
    assert sorted(temps) == [str(i) for i in range(7)]


def test_values_in_dcgm_exporter_units(mig_snapshot: NodeSnapshot) -> None:
    families = compat(render(mig_snapshot))
    gpu = mig_snapshot.gpus[3]
    t = gpu.telemetry
    assert t is not None
    assert t.sm_clock_hz is not None
    assert t.energy_joules is not None

    def at(name: str) -> float:
        return per_gpu(families[name][1])["3"]

    assert at("DCGM_FI_DEV_SM_CLOCK") == pytest.approx(t.sm_clock_hz / 1e6)
    assert at("DCGM_FI_DEV_GPU_TEMP") == t.temperature_celsius
    assert at("DCGM_FI_DEV_POWER_USAGE") == pytest.approx(t.power_watts)
    assert at("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == pytest.approx(t.energy_joules * 1000)
    assert at("DCGM_FI_DEV_FB_USED") == pytest.approx(t.memory_used_bytes / MIB)
    assert at("DCGM_FI_DEV_FB_FREE") == pytest.approx(t.memory_free_bytes / MIB)
    assert t.utilization_gpu_ratio is not None
    assert at("DCGM_FI_DEV_GPU_UTIL") == pytest.approx(t.utilization_gpu_ratio * 100)
    # NVML has no whole-GPU utilization with MIG on: absent, as under dcgm-exporter.
    assert set(per_gpu(families["DCGM_FI_DEV_GPU_UTIL"][1])) == {"2", "3", "4", "5", "6"}
    # No health model: nobody watches XIDs, so "last XID 0" would be a guess.
    assert "DCGM_FI_DEV_XID_ERRORS" not in families


def test_xid_errors_is_the_last_code_seen(mig_snapshot: NodeSnapshot) -> None:
    uuid, lost = mig_snapshot.gpus[4].info.uuid, mig_snapshot.gpus[7].info.uuid
    seen = {(uuid, 79): 2000.0, (uuid, 13): 1000.0}
    families = compat(render(mig_snapshot, health=FakeHealth(NodeView(xid_last_s=seen))))
    xids = per_gpu(families["DCGM_FI_DEV_XID_ERRORS"][1])
    assert xids["4"] == 79  # the newer of the two
    assert xids["3"] == 0  # watched, none seen
    assert "7" not in xids  # lost, no XID: its events are not watched, so 0 is not known
    # A lost GPU keeps the XID it had (an alert on XID 79 needs exactly that series).
    seen = {(lost, 79): 3000.0}
    families = compat(render(mig_snapshot, health=FakeHealth(NodeView(xid_last_s=seen))))
    assert per_gpu(families["DCGM_FI_DEV_XID_ERRORS"][1])["7"] == 79
    assert "7" not in per_gpu(families["DCGM_FI_DEV_GPU_TEMP"][1])


def test_pod_labels_on_a_gpu_a_container_holds(mig_snapshot: NodeSnapshot) -> None:
    uuid = mig_snapshot.gpus[5].info.uuid
    holders = (
        PodDevice("nvidia.com/gpu", uuid, "train-0", "ml", "main", 1),
        PodDevice("nvidia.com/gpu", uuid, "train-1", "ml", "main", 1),  # time-sliced
    )
    families = compat(render(mig_snapshot, allocations=Allocations(1000.0, True, {}, {}, holders)))
    on5 = [labels for labels, _ in families["DCGM_FI_DEV_FB_USED"][1] if labels["gpu"] == "5"]
    assert sorted(labels["pod"] for labels in on5) == ["train-0", "train-1"]
    assert all(set(labels) == GPU_LABELS | POD_LABELS for labels in on5)
    on4 = [labels for labels, _ in families["DCGM_FI_DEV_FB_USED"][1] if labels["gpu"] == "4"]
    assert [set(labels) for labels in on4] == [GPU_LABELS]


def test_not_supported_readings_are_left_out(mig_snapshot: NodeSnapshot) -> None:
    gpus = list(mig_snapshot.gpus)
    t = gpus[2].telemetry
    assert t is not None
    gpus[2] = replace(gpus[2], telemetry=replace(t, power_watts=None, remapped_rows=None))
    families = compat(render(replace(mig_snapshot, gpus=tuple(gpus))))
    assert "2" not in per_gpu(families["DCGM_FI_DEV_POWER_USAGE"][1])
    assert "2" not in per_gpu(families["DCGM_FI_DEV_ROW_REMAP_FAILURE"][1])
    assert "2" in per_gpu(families["DCGM_FI_DEV_GPU_TEMP"][1])


def test_numbers_and_label_values_are_written_as_prometheus_reads_them() -> None:
    assert [dcgm_compat._number(v) for v in (81559.0, 0.5, float("nan"), float("inf"))] == [
        "81559",
        "0.5",
        "NaN",
        "+Inf",
    ]
    assert dcgm_compat._labels((("modelName", 'a"b\\c\n'),)) == 'modelName="a\\"b\\\\c\\n"'


def test_docs_table_lists_every_field_of_the_default_file() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    for f in dcgm_compat.FIELDS:
        assert f"| `{f.name}` | {f.kind} |" in doc, f.name
    for query in dcgm_compat.QUERIES:
        assert f"| `{query}` |" in doc


def test_profiling_fields_per_gpu_and_per_mig_instance(mig_snapshot: NodeSnapshot) -> None:
    gpus = list(mig_snapshot.gpus)
    gpus[3] = replace(gpus[3], profiling=figures())
    # A MIG instance: NVML computes no PCIe figures for it, so those stay absent.
    gi = gpus[0].mig_instances[0]
    on_gi = figures(
        graphics_active_ratio=0.5, pcie_tx_bytes_per_second=None, pcie_rx_bytes_per_second=None
    )
    gpus[0] = replace(gpus[0], mig_instances=(replace(gi, profiling=on_gi),))
    snap = replace(mig_snapshot, gpus=tuple(gpus))
    holder = PodDevice("nvidia.com/mig-1g.10gb", gi.uuid or "", "infer-0", "web", "srv", 1)
    families = compat(render(snap, allocations=Allocations(1000.0, True, {}, {}, (holder,))))

    engine = families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    assert engine[0] == "gauge"
    by_device = {(ls["gpu"], ls.get("GPU_I_ID")): (ls, v) for ls, v in engine[1]}
    assert set(by_device) == {("3", None), ("0", str(gi.instance_id))}
    assert by_device[("3", None)][1] == 0.75
    labels, value = by_device[("0", str(gi.instance_id))]
    assert value == 0.5
    assert set(labels) == GPU_LABELS | POD_LABELS | {"GPU_I_PROFILE", "GPU_I_ID"}
    assert (labels["GPU_I_PROFILE"], labels["pod"]) == ("1g.10gb", "infer-0")
    assert labels["UUID"] == gpus[0].info.uuid  # the parent GPU's, as dcgm-exporter writes it
    assert per_gpu(families["DCGM_FI_PROF_PCIE_TX_BYTES"][1]) == {"3": 2e9}
    assert per_gpu(families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][1]) == {"3": 0.5, "0": 0.5}
    assert per_gpu(families["DCGM_FI_PROF_DRAM_ACTIVE"][1])["3"] == 0.25
    # The instance has no telemetry of its own: no DEV series carries its labels.
    for name, (_kind, samples) in families.items():
        if name.startswith("DCGM_FI_DEV_"):
            assert all("GPU_I_ID" not in ls for ls, _ in samples), name


def test_the_table_names_metrics_the_exporter_catalogs() -> None:
    """Each served field's nodeagent counterpart exists, so the mapping stays true."""
    for f in dcgm_compat.SERVED:
        named = re.findall(r"nodeagent_\w+", f.ours)
        assert named, f.name
        for metric in named:
            assert metric in CATALOG, (f.name, metric)
