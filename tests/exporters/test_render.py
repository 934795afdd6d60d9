"""The renderer: every family with the right values, from hand-built snapshots."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nodeagent.config.metrics import ProbeSection
from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.gpu.types import ClockEventReason, NodeSnapshot, RemappedRows
from nodeagent.runtime.health_source import DeviceHealth, HealthState
from nodeagent.runtime.mig import MigGpuOutcome, MigLayoutStatus
from nodeagent.workloads import CgroupReader, Device, PodIndex, Workload
from nodeagent_exporters.catalog import CATALOG, markdown
from nodeagent_exporters.podresources import Allocations, PodDevice
from nodeagent_exporters.probe import ProbeRunner
from nodeagent_exporters.render import Rendered, Renderer, Sources, age_lines
from tests.exporters.exporter_factories import (
    gpu_state,
    gpu_uuid,
    instance,
    parse_samples,
    snapshot,
    value,
)
from tests.exporters.profiling_factories import with_profiling

DOC = Path(__file__).parents[2] / "docs" / "metrics.md"
UID0 = "00000000-0000-0000-0000-000000000000"
UID1 = "11111111-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class NodeView:
    """The node-level health report the health model hands out (by shape)."""

    level: str = "stable"
    score: float = 0.0
    xids_total: Mapping[tuple[str, int], int] = field(default_factory=dict)
    xid_last_s: Mapping[tuple[str, int], float] = field(default_factory=dict)
    history_errors: int = 0


@dataclass
class FakeHealth:
    """A health source with a node view: a test double for the health model's interface, not
    its logic."""

    devices: dict[str, DeviceHealth] = field(default_factory=dict)
    node: NodeView = field(default_factory=NodeView)

    def device_health(self) -> Mapping[str, DeviceHealth]:
        return self.devices

    def subscribe(self, callback: object) -> object:
        return lambda: None

    def node_health(self) -> NodeView:
        return self.node


def render(
    snap: NodeSnapshot,
    policy: PoolPolicy | None = None,
    health: FakeHealth | None = None,
    allocations: Allocations | None = None,
    restarts: dict[str, int] | None = None,
    advertised: Mapping[str, Mapping[str, bool]] | None = None,
) -> dict:
    renderer = Renderer(
        Sources(
            policy=lambda: policy or PoolPolicy(),
            health=lambda: health,
            allocations=lambda: allocations,
            advertised=lambda: advertised,
            restarts=restarts or {},
        )
    )
    return parse_samples(renderer.render(snap).body.decode())


# What a device plugin advertises: two of four GPU replicas unhealthy, one healthy MIG device.
PLUGIN = {
    "nvidia.com/gpu": {"GPU-a::0": True, "GPU-a::1": True, "GPU-b::0": False, "GPU-b::1": False},
    "nvidia.com/mig-1g.10gb": {"MIG-c": True},
}


def full_node() -> tuple[NodeSnapshot, FakeHealth, Allocations]:
    """Two MIG GPUs, one whole free GPU, one busy GPU, one lost GPU: every family present."""
    mig0 = [instance(0, 7, "1g.10gb", 6, 1, busy=True), instance(0, 1, "3g.40gb", 0, 4)]
    mig1 = [instance(1, 2, "4g.40gb", 0, 4)]
    snap = snapshot(
        [
            with_profiling(gpu_state(0, mig=mig0)),
            gpu_state(
                1, mig=mig1, retired_pages_sbe=0, retired_pages_dbe=0, retired_pages_pending=False
            ),
            gpu_state(2),
            with_profiling(gpu_state(3, processes=2)),
            gpu_state(4, lost=True),
        ],
        nvml_errors={"nvmlDeviceGetHandleByIndex": 1},
    )
    health = FakeHealth(
        devices={
            gpu_uuid(0): DeviceHealth(gpu_uuid(0), 0, HealthState.HEALTHY, (), "", 0.0),
            mig0[0].uuid: DeviceHealth(mig0[0].uuid, 0, HealthState.DEGRADED, (), "", 0.0),
        },
        node=NodeView("unstable", 7.5, {(gpu_uuid(3), 79): 2}, {(gpu_uuid(3), 79): 999.0}),
    )
    allocations = Allocations(
        990.0,
        True,
        {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1},
        {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1},
        (
            PodDevice("nvidia.com/gpu", gpu_uuid(3), "train-0", "ml", "main", 1),
            PodDevice("nvidia.com/mig-1g.10gb", mig0[0].uuid or "", "infer", "web", "srv", 1),
        ),
    )
    return snap, health, allocations


# The MIG reconciler's view after a round in which GPU 1 was blocked by a busy instance.
BLOCKED = MigLayoutStatus(
    "all-1g",
    False,
    "GPU 1: blocked-busy: 3g.20gb@4:4 is busy",
    (
        MigGpuOutcome(0, "unchanged", "not applied: GPU 1 blocked", 0),
        MigGpuOutcome(1, "blocked-busy", "3g.20gb@4:4 is busy", 0),
        MigGpuOutcome(2, "failed", "create 2g.10gb@0:2 failed", 2),
    ),
)


def test_every_emitted_metric_is_in_the_catalog_and_docs(tmp_path: Path) -> None:
    snap, health, allocations = full_node()
    renderer = Renderer(
        Sources(
            policy=lambda: PoolPolicy(expected_driver_version="570.124.06"),
            health=lambda: health,
            allocations=lambda: allocations,
            advertised=lambda: PLUGIN,
            restarts={"sampler": 1},
            mig=lambda: BLOCKED,
            started_at_s=900.0,
            # GPU 3's two processes run in two pods: a shared GPU.
            cgroups=CgroupReader(tmp_path),
            pod_index=lambda: PodIndex({UID0: ("ml", "train-0"), UID1: ("ml", "train-1")}),
            probe=lambda: probe,
            app_xids=lambda: {(Device(3, gpu_uuid(3)), Workload("ml", "train-0", "main"), 13): 2},
            remediation_steps=lambda: {(2, gpu_uuid(2), "validate", "failed"): 1},
            validations=lambda: {gpu_uuid(2): False},
        )
    )
    # A canary that failed once on GPU 3.
    section = ProbeSection(enabled=True, command=(sys.executable, "-c", "raise SystemExit(3)"))
    probe = ProbeRunner(section, lambda: [Device(3, gpu_uuid(3))])
    probe.round()
    for pid, uid in ((100, UID0), (101, UID1)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(f"0::/kubepods/pod{uid}/{'a' * 64}\n")
    rendered = renderer.render(snap)
    text = (rendered.body + age_lines(rendered, 1001.0)).decode()
    emitted = {n for n, _ in parse_samples(text)}
    documented = set(re.findall(r"^\| `(nodeagent_\w+)`", DOC.read_text(), re.MULTILINE))
    assert emitted - documented == set(), "emitted but not in docs/metrics.md"
    # The full node exercises every family, so a cataloged family that never appears is dead.
    assert set(CATALOG) - emitted == set(), "cataloged but never emitted"
    assert DOC.read_text() == markdown(), (
        "docs/metrics.md is stale: python -m nodeagent_exporters.catalog"
    )


def test_a_mig_layout_not_applied_is_exported_with_its_reason_per_gpu() -> None:
    renderer = Renderer(
        Sources(policy=PoolPolicy, mig=lambda: BLOCKED, started_at_s=900.0), clock=lambda: 1000.0
    )
    samples = parse_samples(
        renderer.render(snapshot([gpu_state(i) for i in range(3)])).body.decode()
    )
    assert (
        value(samples, "nodeagent_mig_layout_applied", layout="all-1g", reason=BLOCKED.reason) == 0
    )
    outcomes = {
        dict(labels)["gpu"]: dict(labels)["outcome"]
        for name, labels in samples
        if name == "nodeagent_mig_apply_outcome"
    }
    assert outcomes == {"0": "unchanged", "1": "blocked-busy", "2": "failed"}
    assert value(samples, "nodeagent_mig_unrestored_instances", gpu="2", uuid=gpu_uuid(2)) == 2
    assert value(samples, "nodeagent_start_time_seconds") == 900.0
    # No layout managed: no MIG layout series at all (absent, not "applied").
    quiet = Renderer(Sources(policy=PoolPolicy)).render(snapshot([gpu_state(0)])).body.decode()
    assert "nodeagent_mig_layout_applied" not in quiet


def test_labels_match_the_catalog() -> None:
    snap, health, allocations = full_node()
    samples = render(
        snap, health=health, allocations=allocations, restarts={"x": 0}, advertised=PLUGIN
    )
    for name, labels in samples:
        assert {k for k, _ in labels} == set(CATALOG[name].labels), name


@pytest.mark.parametrize(
    ("expected", "drift"),
    [
        pytest.param(None, 0.0, id="no expectation"),
        pytest.param("570.124.06", 0.0, id="matches"),
        pytest.param("580.65.06", 1.0, id="drifted"),
    ],
)
def test_driver_drift(expected: str | None, drift: float) -> None:
    samples = render(snapshot([gpu_state(0)]), PoolPolicy(expected_driver_version=expected))
    assert (
        value(
            samples,
            "nodeagent_driver_drift",
            driver_version="570.124.06",
            expected_driver_version=expected or "",
        )
        == drift
    )
    assert value(samples, "nodeagent_driver_info", driver_version="570.124.06") == 1.0


@pytest.mark.parametrize(
    ("mask", "active"),
    [
        pytest.param(0x0, set(), id="none"),
        pytest.param(0x1, {"gpu_idle"}, id="idle"),
        pytest.param(0x48, {"hw_slowdown", "hw_thermal_slowdown"}, id="thermal"),
        pytest.param(0x84, {"sw_power_cap", "hw_power_brake_slowdown"}, id="power"),
    ],
)
def test_clock_event_reasons_one_series_each(mask: int, active: set[str]) -> None:
    samples = render(snapshot([gpu_state(0, clock_event_reasons=ClockEventReason(mask))]))
    series = {
        dict(ls)["reason"]: v
        for (n, ls), v in samples.items()
        if n == "nodeagent_gpu_clock_event_active"
    }
    assert len(series) == 9
    assert {r for r, v in series.items() if v == 1.0} == active


def test_telemetry_values_and_not_supported_left_out() -> None:
    samples = render(snapshot([gpu_state(0, power_watts=None, temperature_celsius=55.0)]))
    assert value(samples, "nodeagent_gpu_temperature_celsius", gpu="0") == 55.0
    assert value(samples, "nodeagent_gpu_power_watts", gpu="0") is None
    assert value(samples, "nodeagent_gpu_energy_joules_total", gpu="0") == 123456.0
    assert value(samples, "nodeagent_gpu_sm_clock_hertz", gpu="0") == 1.98e9
    assert (
        value(samples, "nodeagent_gpu_ecc_errors_total", type="corrected", scope="aggregate") == 5.0
    )


def test_row_remap_pending_and_failure() -> None:
    rows = RemappedRows(3, 1, pending=True, failure=False)
    samples = render(snapshot([gpu_state(0, remapped_rows=rows)]))
    assert value(samples, "nodeagent_gpu_row_remap_pending", gpu="0") == 1.0
    assert value(samples, "nodeagent_gpu_row_remap_failure", gpu="0") == 0.0
    assert value(samples, "nodeagent_gpu_remapped_rows_total", type="uncorrectable") == 1.0


@pytest.mark.parametrize(
    ("instances", "free", "creatable_1g", "creatable_7g", "ratio"),
    [
        pytest.param([], 8, 7, 1, 0.0, id="empty gpu"),
        pytest.param([("7g.80gb", 0, 8)], 0, 0, 0, 0.0, id="full gpu"),
        # 1g at slice 0 and 3g at 4: slices 1-3 fit one 2g (2 of 3 usable slices).
        pytest.param([("1g.10gb", 0, 1), ("3g.40gb", 4, 4)], 3, 3, 0, 1 / 3, id="fragmented"),
    ],
)
def test_mig_capacity(
    instances: list[tuple[str, int, int]],
    free: int,
    creatable_1g: int,
    creatable_7g: int,
    ratio: float,
) -> None:
    mig = [instance(0, n + 1, p, s, z) for n, (p, s, z) in enumerate(instances)]
    samples = render(snapshot([gpu_state(0, mig=mig)]))
    assert value(samples, "nodeagent_mig_free_slices", gpu="0") == free
    assert value(samples, "nodeagent_mig_creatable_instances", mig_profile="1g.10gb") == (
        creatable_1g
    )
    assert value(samples, "nodeagent_mig_creatable_instances", mig_profile="7g.80gb") == (
        creatable_7g
    )
    assert value(samples, "nodeagent_mig_fragmentation_ratio", gpu="0") == pytest.approx(ratio)


def test_mig_instance_series() -> None:
    samples = render(snapshot([gpu_state(0, mig=[instance(0, 5, "2g.20gb", 2, 2, busy=True)])]))
    assert (
        value(
            samples,
            "nodeagent_mig_instance_info",
            mig_profile="2g.20gb",
            mig_instance="5",
            placement_start="2",
            placement_size="2",
        )
        == 1.0
    )
    assert value(samples, "nodeagent_mig_instance_busy", mig_instance="5") == 1.0


def test_stranded_mig_slices_follow_request_sizes() -> None:
    # 3g at 0 and 2g at 4 leave slices 6-7: a 1g.20gb fits there, a 3g (or a 2g, whose
    # placements start at 0, 2 and 4 only) does not.
    mig = [instance(0, 1, "3g.40gb", 0, 4), instance(0, 2, "2g.20gb", 4, 2)]
    snap = snapshot([gpu_state(0, mig=mig)])
    only_3g = render(snap, PoolPolicy(request_sizes=("3g.40gb",)))
    with_2g = render(snap, PoolPolicy(request_sizes=("3g.40gb", "2g.20gb")))
    with_1g = render(snap, PoolPolicy(request_sizes=("3g.40gb", "1g.20gb")))
    assert value(only_3g, "nodeagent_stranded_mig_slices", gpu="0") == 2.0
    assert value(with_2g, "nodeagent_stranded_mig_slices", gpu="0") == 2.0
    assert value(with_1g, "nodeagent_stranded_mig_slices", gpu="0") == 0.0


@pytest.mark.parametrize(
    ("nvlink", "request_sizes", "free", "nvset", "stranded"),
    [
        pytest.param(True, (), 3, 3, 0, id="nvswitch, any size"),
        pytest.param(False, (), 3, 1, 0, id="pcie only"),
        pytest.param(True, ("2gpu",), 3, 3, 1, id="pairs strand the odd gpu"),
        pytest.param(False, ("2gpu",), 3, 1, 3, id="pairs need nvlink"),
        pytest.param(True, ("1g.10gb",), 3, 3, 3, id="mig-only pool strands whole gpus"),
    ],
)
def test_free_whole_gpus(
    nvlink: bool, request_sizes: tuple[str, ...], free: int, nvset: int, stranded: int
) -> None:
    # GPUs 0-2 free, 3 runs a process, 4 is lost, 5 is allocated to a pod.
    gpus = [gpu_state(i) for i in range(3)]
    gpus += [gpu_state(3, processes=1), gpu_state(4, lost=True), gpu_state(5)]
    allocations = Allocations(
        1000.0, True, {}, {}, (PodDevice("nvidia.com/gpu", gpu_uuid(5), "p", "n", "c", 1),)
    )
    samples = render(
        snapshot(gpus, nvlink=nvlink),
        PoolPolicy(request_sizes=request_sizes),
        allocations=allocations,
    )
    assert value(samples, "nodeagent_free_gpus") == free
    assert value(samples, "nodeagent_free_nvlink_set_gpus") == nvset
    assert value(samples, "nodeagent_stranded_gpus") == stranded


def test_unhealthy_gpu_is_not_free() -> None:
    health = FakeHealth(
        devices={gpu_uuid(0): DeviceHealth(gpu_uuid(0), 0, HealthState.UNHEALTHY, (), "", 0.0)}
    )
    samples = render(snapshot([gpu_state(0), gpu_state(1)]), health=health)
    assert value(samples, "nodeagent_free_gpus") == 1.0
    assert value(samples, "nodeagent_gpu_health_state", gpu="0", state="unhealthy") == 1.0
    assert value(samples, "nodeagent_gpu_health_state", gpu="0", state="healthy") == 0.0


def test_health_without_a_health_model_reports_only_lost() -> None:
    samples = render(snapshot([gpu_state(0), gpu_state(1, lost=True)]))
    assert value(samples, "nodeagent_gpu_health_state", gpu="0", state="healthy") is None
    assert value(samples, "nodeagent_gpu_health_state", gpu="1", state="lost") == 1.0


def test_xids_stability_and_pod_attribution() -> None:
    snap, health, allocations = full_node()
    samples = render(snap, health=health, allocations=allocations)
    assert value(samples, "nodeagent_gpu_xid_errors_total", gpu="3", xid="79") == 2.0
    assert value(samples, "nodeagent_gpu_xid_last_seen_timestamp_seconds", xid="79") == 999.0
    assert value(samples, "nodeagent_node_stability_score") == 7.5
    assert value(samples, "nodeagent_node_stability_level", level="unstable") == 1.0
    assert value(samples, "nodeagent_node_stability_level", level="stable") == 0.0
    mig_pod = value(samples, "nodeagent_device_plugin_pod_devices", pod="infer")
    assert mig_pod == 1.0
    mig_labels = next(
        dict(ls)
        for (n, ls), _ in samples.items()
        if n == "nodeagent_device_plugin_pod_devices" and dict(ls)["pod"] == "infer"
    )
    assert (mig_labels["gpu"], mig_labels["mig_profile"], mig_labels["mig_instance"]) == (
        "0",
        "1g.10gb",
        "7",
    )
    assert (
        value(samples, "nodeagent_device_plugin_devices_advertised", resource="nvidia.com/gpu")
        == 2.0
    )
    assert value(samples, "nodeagent_pod_resources_age_seconds") == 10.0


NEVER_POLLED = Allocations(1000.0, False, known=False)
POLLED_NO_PODS = Allocations(995.0, True, {"nvidia.com/gpu": 4}, {})
KUBELET_ONLY = Allocations(
    995.0, True, {"nvidia.com/gpu": 8}, {"nvidia.com/gpu": 3, "nvidia.com/mig-1g.10gb": 1}
)
STALE = Allocations(990.0, False, {"nvidia.com/gpu": 8}, {"nvidia.com/gpu": 3})
GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"


@pytest.mark.parametrize(
    ("advertised", "allocations", "expected"),
    [
        pytest.param(
            PLUGIN,
            None,
            {"advertised": {GPU: 4, MIG: 1}, "unhealthy": {GPU: 2, MIG: 0}, "allocated": {}},
            id="plugin, no pod attribution: allocated unknown",
        ),
        pytest.param(
            PLUGIN,
            NEVER_POLLED,
            {"advertised": {GPU: 4, MIG: 1}, "unhealthy": {GPU: 2, MIG: 0}, "allocated": {}},
            id="plugin, kubelet never answered: allocated unknown",
        ),
        pytest.param(
            PLUGIN,
            POLLED_NO_PODS,
            {
                "advertised": {GPU: 4, MIG: 1},
                "unhealthy": {GPU: 2, MIG: 0},
                "allocated": {GPU: 0, MIG: 0},
            },
            id="plugin, kubelet answered: no allocations is 0",
        ),
        pytest.param(
            {},
            POLLED_NO_PODS,
            {"advertised": {}, "unhealthy": {}, "allocated": {GPU: 0}},
            id="plugin not serving yet: nothing advertised, not the kubelet's count",
        ),
        pytest.param(
            None,
            KUBELET_ONLY,
            {"advertised": {GPU: 8}, "unhealthy": {}, "allocated": {GPU: 3, MIG: 1}},
            id="plugin disabled: the kubelet's allocatable",
        ),
        pytest.param(
            None,
            STALE,
            {"advertised": {GPU: 8}, "unhealthy": {}, "allocated": {GPU: 3}},
            id="kubelet stopped answering: last known counts",
        ),
        pytest.param(
            None,
            NEVER_POLLED,
            {"advertised": {}, "unhealthy": {}, "allocated": {}},
            id="nothing known",
        ),
    ],
)
def test_device_plugin_counts_tell_unknown_from_zero(
    advertised: Mapping[str, Mapping[str, bool]] | None,
    allocations: Allocations | None,
    expected: dict[str, dict[str, int]],
) -> None:
    samples = render(snapshot([gpu_state(0)]), allocations=allocations, advertised=advertised)
    for kind, want in expected.items():
        got = {
            dict(ls)["resource"]: v
            for (n, ls), v in samples.items()
            if n == f"nodeagent_device_plugin_devices_{kind}"
        }
        assert got == want, kind
    up = value(samples, "nodeagent_pod_resources_up")
    assert up == (None if allocations is None else float(allocations.ok))
    known = allocations is not None and allocations.known
    assert (value(samples, "nodeagent_pod_resources_age_seconds") is not None) is known


def test_nvml_errors_accumulate_across_snapshots_rendered_or_not() -> None:
    renderer = Renderer(Sources(policy=PoolPolicy))

    def one_pass() -> NodeSnapshot:
        return snapshot([gpu_state(0)], nvml_errors={"nvmlDeviceGetPowerUsage": 2})

    renderer.render(one_pass())
    renderer.observe(one_pass())  # a pass nobody scraped still counts
    last = one_pass()
    renderer.observe(last)
    renderer.observe(last)  # the same pass observed again is not counted twice
    samples = parse_samples(renderer.render(last).body.decode())
    assert value(samples, "nodeagent_nvml_errors_total", function="nvmlDeviceGetPowerUsage") == 6.0


@pytest.mark.parametrize(
    ("now", "age"),
    [
        pytest.param(1002.5, "2.500", id="fresh"),
        pytest.param(990.0, "0.000", id="clock stepped back"),
    ],
)
def test_age_line(now: float, age: str) -> None:
    rendered = Rendered(b"", b"", 1000.0)
    assert age_lines(rendered, now).endswith(f"nodeagent_snapshot_age_seconds {age}\n".encode())


def test_family_cache_output_equals_a_fresh_render() -> None:
    """Reusing unchanged families must give the bytes a fresh renderer gives."""

    def without_render_duration(body: bytes) -> list[bytes]:
        return [line for line in body.splitlines() if b"render_duration" not in line]

    def renderer() -> Renderer:
        return Renderer(Sources(policy=PoolPolicy))

    before = snapshot([gpu_state(0, mig=[instance(0, 1, "3g.40gb", 0, 4)]), gpu_state(1)])
    after = snapshot([gpu_state(0, mig=[]), gpu_state(1, temperature_celsius=77.0), gpu_state(2)])
    warm = renderer()
    warm.render(before)
    cached = warm.render(after).body
    fresh = renderer().render(after).body
    assert without_render_duration(cached) == without_render_duration(fresh)
    assert b'nodeagent_gpu_temperature_celsius{gpu="1"' in cached
    assert b"nodeagent_mig_instance_info" not in cached  # a vanished family is not served
