"""A real Prometheus runs every dcgm-exporter query docs/metrics.md lists against the agent.

The agent (sampler, health model, metrics with ``metrics.dcgm_compat: true``) runs on a
simulated dgx-h100 with two MIG GPUs and a pod holding a whole GPU; ``prometheus`` scrapes it on
loopback with a temporary config and data directory. Each query must return series. With
``CI=true`` a missing binary fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from nodeagent.agent.sampler import Sampler
from nodeagent.config.metrics import MetricsSection
from nodeagent.config.schema import AgentConfig, NodeSection, SamplerSection
from nodeagent.gpu.node import GpuNode
from nodeagent.health import component as health_component
from nodeagent.kubelet.podresources.v1 import api_pb2_grpc
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl
from nodeagent.testing.nodes import split_into
from nodeagent.testing.podresources import FakeKubelet
from nodeagent.testing.prometheus import PrometheusServer
from nodeagent_exporters import dcgm_compat
from nodeagent_exporters.component import MetricsExporter, build
from tests.exporters.test_prometheus_integration import prometheus_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def agent(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> Iterator[tuple[MetricsExporter, SimControl]]:
    """The agent's sampler, health and metrics threads with the compatibility view on."""
    node = make_node("dgx-h100")
    control = SimControl(sim_state_dir)
    split_into(node, control, (0, 1), "1g.10gb")
    kubelet = FakeKubelet()
    whole = node.snapshot().gpus[4].info.uuid
    kubelet.allocatable = {"nvidia.com/gpu": [whole]}
    kubelet.pods = [("train-0", "ml", "main", "nvidia.com/gpu", [whole])]
    socket_path = tmp_path / "pod-resources.sock"
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, grpc_server)
    grpc_server.add_insecure_port(f"unix://{socket_path}")
    grpc_server.start()
    config = AgentConfig(
        node=NodeSection(name="gpu-node-1"),
        state_dir=tmp_path / "state",
        metrics=MetricsSection(
            address="127.0.0.1:0",
            pod_resources_socket=socket_path,
            pod_resources_interval_s=1,
            dcgm_compat=True,
        ),
    )
    snapshots = SnapshotStore()
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
    # The event set is open once health is ready: an XID injected before that is never seen
    # (a GPU off the bus no longer registers events), and its series would never appear.
    deadline = time.monotonic() + 10
    while not health.ready:
        assert time.monotonic() < deadline, "health never became ready"
        time.sleep(0.05)
    try:
        yield exporter, control
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        grpc_server.stop(None)


def test_every_listed_dcgm_query_returns_series(
    agent: tuple[MetricsExporter, SimControl], tmp_path: Path
) -> None:
    binary = prometheus_binary()
    exporter, control = agent
    deadline = time.monotonic() + 10
    while exporter.server is None or not exporter.ready:
        assert time.monotonic() < deadline, "exporter never became ready"
        time.sleep(0.05)
    # An XID for the alert query; the health model sees it through the simulator's events.
    control.inject("xid", 3, code=79)
    prom = PrometheusServer(binary, tmp_path / "prom", [f"127.0.0.1:{exporter.server.port}"])
    try:
        prom.wait_for('up{job="nodeagent"}', lambda r: bool(r) and r[0]["value"][1] == "1", 60)
        for query in dcgm_compat.QUERIES:
            prom.wait_for(query, lambda r: bool(r), 30)
        # The series carry dcgm-exporter's labels, with their values.
        temp = prom.query('DCGM_FI_DEV_GPU_TEMP{gpu="2"}')[0]["metric"]
        assert temp["Hostname"] == "gpu-node-1"
        assert temp["device"] == "nvidia2"
        assert temp["modelName"] == "NVIDIA H100 80GB HBM3"
        assert temp["UUID"].startswith("GPU-")
        held = prom.query('DCGM_FI_DEV_FB_USED{pod!=""}')[0]["metric"]
        assert (held["gpu"], held["pod"], held["namespace"], held["container"]) == (
            "4",
            "train-0",
            "ml",
            "main",
        )
        xid = prom.query("DCGM_FI_DEV_XID_ERRORS > 0")
        assert [(s["metric"]["gpu"], s["value"][1]) for s in xid] == [("3", "79")]
        # The same scrape still serves the agent's own families.
        assert prom.query("nodeagent_gpus")[0]["value"][1] == "8"
    finally:
        prom.stop()
