"""A real Prometheus scrapes the exporter on a simulated dgx-h100 with MIG and pods.

The test starts ``prometheus`` on loopback with a temporary config and data directory, waits
for a scrape, reads series back through the HTTP query API, injects faults in the simulator
and waits for the series to change. With ``CI=true`` it must run: a missing binary fails.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from nodeagent.agent.sampler import Sampler
from nodeagent.config.metrics import MetricsSection
from nodeagent.config.pool_policy import PoolPolicy
from nodeagent.config.schema import AgentConfig, NodeSection, SamplerSection
from nodeagent.gpu.node import GpuNode
from nodeagent.health import component as health_component
from nodeagent.kubelet.podresources.v1 import api_pb2_grpc
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl
from nodeagent.testing.nodes import split_into
from nodeagent.testing.podresources import FakeKubelet
from nodeagent.testing.prometheus import PrometheusServer, find_prometheus
from nodeagent_exporters.component import MetricsExporter, build

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def prometheus_binary() -> str:
    path = find_prometheus()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is missing in CI: apt-get install prometheus")
        pytest.skip("prometheus not installed (Debian package prometheus)")
    return path


@pytest.fixture
def agent(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> Iterator[tuple[MetricsExporter, SimControl, GpuNode]]:
    """Sampler + exporter on dgx-h100 with 2 GPUs split into 1g.10gb and a pod on each MIG."""
    node = make_node("dgx-h100")
    control = SimControl(sim_state_dir)
    kubelet = FakeKubelet()
    split_into(node, control, (0, 1), "1g.10gb")
    mig_uuids = [gi.uuid for g in (0, 1) for gi in node.mig_instances(g)]
    kubelet.allocatable = {"nvidia.com/mig-1g.10gb": [u for u in mig_uuids if u]}
    kubelet.pods = [
        (f"infer-{n}", "serving", "model", "nvidia.com/mig-1g.10gb", [uuid])
        for n, uuid in enumerate(mig_uuids[:5])
        if uuid
    ]
    socket_path = tmp_path / "pod-resources.sock"
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, grpc_server)
    grpc_server.add_insecure_port(f"unix://{socket_path}")
    grpc_server.start()

    config = AgentConfig(
        node=NodeSection(pool="train"),
        state_dir=tmp_path / "state",
        metrics=MetricsSection(
            address="127.0.0.1:0", pod_resources_socket=socket_path, pod_resources_interval_s=1
        ),
        pools={"train": PoolPolicy(expected_driver_version="570.124.06")},
    )
    snapshots = SnapshotStore()
    # The real health model, built first as in the agent, so XIDs and stability reach the exporter
    # exactly as in production.
    model = health_component.build_model(config)
    assert model is not None
    exporter = build(config, snapshots, health=model)
    assert isinstance(exporter, MetricsExporter)
    health = health_component.build(config, model, node, snapshots)
    sampler = Sampler(node, snapshots, SamplerSection(interval_s=0.5))
    stop = threading.Event()
    threads = [threading.Thread(target=c.run, args=(stop,)) for c in (sampler, health, exporter)]
    for t in threads:
        t.start()
    try:
        yield exporter, control, node
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        grpc_server.stop(None)


def test_prometheus_scrapes_series_and_sees_faults(
    agent: tuple[MetricsExporter, SimControl, GpuNode], tmp_path: Path
) -> None:
    binary = prometheus_binary()
    exporter, control, _node = agent
    deadline = time.monotonic() + 10
    while exporter.server is None or not exporter.ready:
        assert time.monotonic() < deadline, "exporter never became ready"
        time.sleep(0.05)
    prom = PrometheusServer(binary, tmp_path / "prom", [f"127.0.0.1:{exporter.server.port}"])
    try:
        prom.wait_for('up{job="nodeagent"}', lambda r: r and r[0]["value"][1] == "1", 60)
        gpus = prom.query("nodeagent_gpus")
        assert gpus[0]["value"][1] == "8"
        instances = prom.query("count(nodeagent_mig_instance_info)")
        assert instances[0]["value"][1] == "14"
        pool = prom.query("nodeagent_node_pool_info")
        assert pool[0]["metric"]["pool"] == "train"
        prom.wait_for(
            "count(nodeagent_device_plugin_pod_devices)",
            lambda r: bool(r) and r[0]["value"][1] == "5",
            20,
        )
        pod = prom.query('nodeagent_device_plugin_pod_devices{pod="infer-0"}')[0]["metric"]
        assert (pod["namespace"], pod["mig_profile"], pod["gpu"]) == ("serving", "1g.10gb", "0")
        assert prom.query('nodeagent_gpu_row_remap_pending{gpu="5"}')[0]["value"][1] == "0"
        assert prom.query("nodeagent_driver_drift")[0]["value"][1] == "0"

        assert prom.query("nodeagent_node_stability_level == 1")[0]["metric"]["level"] == "stable"

        control.inject("xid", 3, code=79)
        control.inject("remap-pending", 5)
        control.inject("driver", 0, version="580.65.06")
        prom.wait_for(
            'nodeagent_gpu_row_remap_pending{gpu="5"}',
            lambda r: bool(r) and r[0]["value"][1] == "1",
            20,
        )
        drift = prom.wait_for("nodeagent_driver_drift == 1", lambda r: bool(r), 20)
        assert drift[0]["metric"]["driver_version"] == "580.65.06"
        xid = prom.wait_for('nodeagent_gpu_xid_errors_total{xid="79"}', lambda r: bool(r), 20)
        assert (xid[0]["metric"]["gpu"], xid[0]["value"][1]) == ("3", "1")
        prom.wait_for(
            'nodeagent_gpu_health_state{gpu="3",state="healthy"} == 0', lambda r: bool(r), 20
        )
        age = float(prom.query("nodeagent_snapshot_age_seconds")[0]["value"][1])
        assert 0 <= age < 5
    finally:
        prom.stop()
