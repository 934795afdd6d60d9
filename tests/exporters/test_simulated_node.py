"""Every metric family on a simulated dgx-h100 with MIG, through the real components.

The hand-built snapshot in test_render.py pins exact values; this test proves the
catalog is reachable on a simulated node: a MIG layout applied by the MIG applier, the real
health model fed by the sampler and the GPU event watcher (with an injected XID and a failing
NVML function), the real device plugin registered with the test kubelet, and pod attribution
from a test pod-resources server. A family outside ``ABSENT_ON_H100`` that is not scraped fails.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from nodeagent.agent.sampler import Sampler
from nodeagent.agent.supervisor import Supervisor
from nodeagent.config.schema import SamplerSection
from nodeagent.gpu.node import GpuNode
from nodeagent.health import component as health_component
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl
from nodeagent.testing.kubelet import TestKubelet
from nodeagent.testing.podresources import FakeKubelet, serving
from nodeagent.testing.waiting import wait_until
from nodeagent.workloads import PodIndex
from nodeagent_device_plugin import component as device_plugin_component
from nodeagent_exporters import component as exporters_component
from nodeagent_exporters.catalog import CATALOG
from nodeagent_exporters.component import MetricsExporter
from nodeagent_mig import reconciler as mig_reconciler
from nodeagent_mig.apply import reconcile
from nodeagent_mig.config import parse_config
from tests.device_plugin.conftest import make_config
from tests.exporters.exporter_factories import Samples, parse_samples, value
from tests.exporters.test_server import get

# Families that cannot appear on this hardware, and why. Anything else missing is a failure.
ABSENT_ON_H100 = {
    # H100 replaces bad memory rows (row remapping); page retirement is NOT_SUPPORTED there,
    # so NVML has no retired-page counts to report (A100 and H100 alike; pre-Ampere GPUs only).
    "nodeagent_gpu_retired_pages_total",
    "nodeagent_gpu_retired_pages_pending",
}
MIG_GPUS = (0, 1, 2, 3)  # all-balanced; GPUs 4-7 stay whole (free whole-GPU capacity metrics)
# The default file's all-balanced for H100-80GB on the MIG GPUs only.
LAYOUT = """
version: v1
mig-configs:
  half-balanced:
    - devices: [0, 1, 2, 3]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - devices: [4, 5, 6, 7]
      mig-enabled: false
"""
# Remediation steps run only once a fault has cleared (after health.fatal_hold_s), and only
# where the pool enables them: tests/health/test_validation.py and the renderer's test.
AFTER_A_CLEARED_FAULT = {"nodeagent_gpu_remediation_steps_total", "nodeagent_gpu_validation_passed"}
XID_GPU, XID = 5, 48  # a double-bit ECC error on a whole GPU
APP_XID = 13  # a graphics engine exception: the application's fault
NVML_ERROR_GPU, NVML_FUNCTION = 6, "nvmlDeviceGetPowerUsage"


@pytest.fixture
def pod_resources(short_dir: Path) -> Iterator[tuple[FakeKubelet, Path]]:
    """A test pod-resources server on a unix socket."""
    socket = short_dir / "pod-resources.sock"
    with serving(socket) as servicer:
        yield servicer, socket


def test_every_family_is_scraped_from_a_simulated_mig_node(
    make_node: Callable[..., GpuNode],
    sim_state_dir: Path,
    short_dir: Path,
    pod_resources: tuple[FakeKubelet, Path],
) -> None:
    node = make_node("dgx-h100")
    sim = SimControl(sim_state_dir)
    # Half the node in MIG through the MIG applier (the agent's entry point), half whole.
    layout = parse_config(LAYOUT)
    report = reconcile(node, layout, "half-balanced", state_dir=short_dir / "mig", allow_reset=True)
    assert report.ok, report.to_dict()
    snapshot = node.snapshot()
    mig_gpus = [g for g in snapshot.gpus if g.info.mig_enabled]
    assert [g.info.index for g in mig_gpus] == list(MIG_GPUS)
    busy = next(i.uuid for i in mig_gpus[0].mig_instances if i.profile == "1g.10gb")
    assert busy is not None
    sim.add_process(0, mig_uuid=busy)  # a busy MIG instance and a process

    servicer, socket = pod_resources
    layout_file = short_dir / "layouts.yaml"
    layout_file.write_text(LAYOUT)
    config = make_config(
        {
            "state_dir": str(short_dir / "state"),
            "mig": {"layout_file": str(layout_file)},
            "device_plugin": {"kubelet_dir": str(short_dir / "kubelet"), "mig_strategy": "mixed"},
            "metrics": {
                "address": "127.0.0.1:0",
                "pod_resources_socket": str(socket),
                "pod_resources_interval_s": 1.0,  # the pods are listed after the poller starts
                "proc_root": str(short_dir / "proc"),  # no cgroup files: pod-resources decides
                "probe": {"enabled": True, "command": [sys.executable, "-c", "pass"]},
            },
            "pools": {
                "default": {
                    "expected_driver_version": snapshot.driver_version,
                    "mig_layout": "half-balanced",
                }
            },
        }
    )
    # The agent's MIG reconciler finds the layout applied: its round feeds the MIG series.
    reconciler = mig_reconciler.build(config, node, lock_file=short_dir / "mig.lock")
    assert reconciler is not None
    reconciler.reconcile_once()
    assert reconciler.applied_layout == "half-balanced"
    snapshots = SnapshotStore()
    restarts: dict[str, int] = {}
    # The wiring's order: the health model, the plugin, the exporter, then health around it.
    model = health_component.build_model(config)
    assert model is not None
    plugin = device_plugin_component.build(config, snapshots, model)
    assert plugin is not None
    xids = health_component.build_attributor(config, lambda: exporter.renderer.processes)
    assert xids is not None
    exporter = exporters_component.build(
        config,
        snapshots,
        app_xids=xids.counts,
        health=model,
        devices=plugin,
        restarts=restarts,
        mig_status=reconciler.status,
        started_at_s=snapshot.timestamp_s,
    )
    assert isinstance(exporter, MetricsExporter)
    health = health_component.build(config, model, node, snapshots, xids=xids)
    kubelet = TestKubelet(short_dir / "kubelet")
    kubelet.start()
    sampler = Sampler(node, snapshots, SamplerSection(interval_s=1.0))
    # Run as the agent does: under the supervisor, which counts restarts for the exporter.
    supervisor = Supervisor(restarts)
    for component in (health, plugin, exporter):
        supervisor.start(component)
    try:
        sampler.sample_once()  # the plugin starts from the first snapshot
        assert wait_until(lambda: health.ready, 10.0), "the health component never became ready"
        mig_resource = "nvidia.com/mig-1g.10gb"
        listed = kubelet.wait_devices(mig_resource, lambda d: len(d) == 2 * len(MIG_GPUS))
        whole = kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8 - len(MIG_GPUS))
        # Pods hold one MIG device (the busy one) and one whole GPU, as the kubelet lists them.
        assert busy in listed
        servicer.allocatable = {mig_resource: sorted(listed), "nvidia.com/gpu": sorted(whole)}
        servicer.pods = [
            ("infer-0", "web", "server", mig_resource, [busy]),
            ("train-0", "ml", "main", "nvidia.com/gpu", [sorted(whole)[0]]),
        ]
        # train-0 runs a process on its GPU: per-workload memory and SM share; a second pod
        # (known by its cgroup and the pod list) shares the GPU with it.
        trained = next(g.info.index for g in snapshot.gpus if g.info.uuid == sorted(whole)[0])
        sim.add_process(trained, used_memory_mib=1234, load=0.5)
        neighbour = sim.add_process(trained, used_memory_mib=100, load=0.2)
        uid = "11111111-2222-3333-4444-555555555555"
        (short_dir / "proc" / str(neighbour)).mkdir(parents=True)
        (short_dir / "proc" / str(neighbour) / "cgroup").write_text(
            f"0::/kubepods/besteffort/pod{uid}/{'e' * 64}\n"
        )
        exporter.pod_index = SimpleNamespace(latest=PodIndex({uid: ("ml", "side-car-job")}))
        app_xid_injected = False

        sim.inject("xid", XID_GPU, code=XID)
        sim.inject("nvml-error", NVML_ERROR_GPU, code=10, function=NVML_FUNCTION)
        xid_gpu = snapshot.gpus[XID_GPU].info.uuid
        failing = snapshot.gpus[NVML_ERROR_GPU].info.uuid

        def scrape() -> Samples:
            assert exporter.server is not None
            return parse_samples(get(exporter.server.port, "/metrics")[2].decode())

        seen: list[Samples] = []

        def settled() -> bool:
            # Sample until the XID, the NVML error and the pods have all reached the exporter.
            # A probe round first, on the devices the last render saw shared (the probe's own
            # loop waits its interval before the first round).
            assert exporter.probe is not None
            exporter.probe.round()
            nonlocal app_xid_injected
            if not app_xid_injected and exporter.renderer.shared:
                # An application XID on the shared GPU, once its pods are attributed.
                sim.inject("xid", trained, code=APP_XID)
                app_xid_injected = True
            sampler.sample_once()
            wait_until(lambda: exporter.latest is not None, 1.0)
            seen.append(scrape())
            samples = seen[-1]
            return (
                value(samples, "nodeagent_gpu_xid_errors_total", uuid=xid_gpu, xid=str(XID)) == 1.0
                and value(samples, "nodeagent_pod_resources_up") == 1.0
                and value(samples, "nodeagent_device_plugin_pod_devices", pod="infer-0") is not None
                and value(samples, "nodeagent_workload_gpu_sm_share_ratio", pod="train-0")
                is not None
                and value(samples, "nodeagent_shared_gpu_probe_up", gpu=str(trained)) == 1.0
                and value(
                    samples, "nodeagent_workload_gpu_xid_errors_total", pod="side-car-job", xid="13"
                )
                == 1.0
                and (value(samples, "nodeagent_nvml_errors_total", function=NVML_FUNCTION) or 0)
                >= 1
                and value(samples, "nodeagent_gpu_health_state", uuid=failing, state="degraded")
                == 1.0
            )

        assert wait_until(settled, 10.0), sorted({n for n, _ in seen[-1]}) if seen else "no scrape"
        samples = seen[-1]
        mem = "nodeagent_workload_gpu_memory_used_bytes"
        assert value(samples, mem, pod="train-0") == 1234 * 1024 * 1024
        assert value(samples, mem, pod="side-car-job") == 100 * 1024 * 1024
        assert value(samples, "nodeagent_shared_gpu_workloads", gpu=str(trained)) == 2
        assert value(samples, mem, pod="infer-0", mig_profile="1g.10gb") == 1024 * 1024 * 1024
        emitted = {name for name, _ in samples}
        # A counter's samples carry the _total suffix the catalog names include.
        missing = set(CATALOG) - emitted - ABSENT_ON_H100 - AFTER_A_CLEARED_FAULT
        assert missing == set(), f"families not scraped from the simulated node: {missing}"
        # The exemptions must stay honest: each one is really absent here.
        assert ABSENT_ON_H100 & emitted == set(), "a family listed as absent is present"
        assert AFTER_A_CLEARED_FAULT & emitted == set(), "remediation ran without a cleared fault"
        assert set(CATALOG) >= ABSENT_ON_H100, "the absent list names unknown families"
        # The injected faults are what the families report, not just present.
        assert value(samples, "nodeagent_gpu_health_state", uuid=xid_gpu, state="healthy") == 0.0
        assert value(samples, "nodeagent_gpu_power_watts", uuid=failing) is None
        assert value(samples, "nodeagent_node_stability_level", level="stable") == 0.0
        for name in ("health", "device-plugin", "metrics"):  # nothing crashed
            restarts = value(samples, "nodeagent_component_restarts_total", component=name)
            assert restarts == 0.0, (name, restarts)
    finally:
        assert supervisor.stop(10.0) == []
        kubelet.stop()
