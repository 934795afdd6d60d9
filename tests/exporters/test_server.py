"""The HTTP server and the metrics component on a simulated node."""

from __future__ import annotations

import gzip
import http.client
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.agent.sampler import Sampler
from nodeagent.config.metrics import MetricsSection
from nodeagent.config.schema import AgentConfig, SamplerSection
from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.component import Idle, Preparable
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl
from nodeagent.testing.waiting import wait_until
from nodeagent_exporters.component import MetricsExporter, build
from nodeagent_exporters.render import Rendered
from nodeagent_exporters.server import MetricsServer, TlsFiles, parse_address
from tests.deploy.tools import require_tool
from tests.exporters.exporter_factories import parse_samples, value

BODY = b"# HELP x y\n# TYPE x gauge\nx 1.0\n"


def get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    out = resp.status, dict(resp.getheaders()), resp.read()
    conn.close()
    return out


@pytest.fixture
def serve() -> Iterator[Callable[..., MetricsServer]]:
    servers: list[MetricsServer] = []

    def start(body: Rendered | None, ready: bool = True, **kw: object) -> MetricsServer:
        server = MetricsServer(
            "127.0.0.1:0", lambda: body, lambda: ready, clock=lambda: 1003.0, **kw
        )  # type: ignore[arg-type]
        server.start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()


@pytest.mark.parametrize(
    ("address", "pair"),
    [
        pytest.param("0.0.0.0:9475", ("0.0.0.0", 9475), id="ipv4"),
        pytest.param("[::1]:9475", ("::1", 9475), id="ipv6"),
        pytest.param(":9475", ("", 9475), id="all addresses"),
    ],
)
def test_parse_address(address: str, pair: tuple[str, int]) -> None:
    assert parse_address(address) == pair


@pytest.mark.parametrize("address", ["9475", "host:", "host:99999", "host:http"])
def test_parse_address_rejects(address: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(address)


def test_metrics_plain_and_gzip_carry_the_age(serve: Callable[..., MetricsServer]) -> None:
    server = serve(Rendered(BODY, gzip.compress(BODY), 1000.0))
    status, headers, body = get(server.port, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert body.startswith(BODY)
    assert body.endswith(b"nodeagent_snapshot_age_seconds 3.000\n")
    status, headers, zipped = get(server.port, "/metrics", {"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(zipped) == body  # multi-member gzip decodes to the same text


@pytest.mark.parametrize(
    ("body", "ready", "path", "status"),
    [
        pytest.param(None, True, "/metrics", 503, id="nothing rendered yet"),
        pytest.param(None, True, "/healthz", 200, id="alive"),
        pytest.param(None, False, "/readyz", 503, id="not ready"),
        pytest.param(None, True, "/readyz", 200, id="ready"),
        pytest.param(None, True, "/nope", 404, id="unknown path"),
    ],
)
def test_endpoints(
    serve: Callable[..., MetricsServer],
    body: Rendered | None,
    ready: bool,
    path: str,
    status: int,
) -> None:
    assert get(serve(body, ready).port, path)[0] == status


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    # Skipped without openssl on a developer's machine; under CI (which installs it) a failure.
    openssl = require_tool("openssl")

    def _openssl(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    for name in ("ca", "server", "client"):
        _openssl("genrsa", "-out", str(tmp_path / f"{name}.key"), "2048")
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(tmp_path / "ca.key"),
        "-subj",
        "/CN=test-ca",
        "-days",
        "1",
        "-out",
        str(tmp_path / "ca.pem"),
    )
    ext = tmp_path / "san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl(
            "req",
            "-new",
            "-key",
            str(tmp_path / f"{name}.key"),
            "-subj",
            f"/CN={name}",
            "-out",
            str(tmp_path / f"{name}.csr"),
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(tmp_path / f"{name}.csr"),
            "-CA",
            str(tmp_path / "ca.pem"),
            "-CAkey",
            str(tmp_path / "ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            str(ext),
            "-out",
            str(tmp_path / f"{name}.pem"),
        )
    return tmp_path


def _https_get(port: int, pki: Path, client_cert: bool) -> int:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if client_cert:
        ctx.load_cert_chain(pki / "client.pem", pki / "client.key")
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    conn.request("GET", "/healthz")
    status = conn.getresponse().status
    conn.close()
    return status


def test_tls_with_client_certificates(serve: Callable[..., MetricsServer], pki: Path) -> None:
    tls = TlsFiles(pki / "server.pem", pki / "server.key", pki / "ca.pem")
    server = serve(None, tls=tls)
    assert _https_get(server.port, pki, client_cert=True) == 200
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _https_get(server.port, pki, client_cert=False)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param({"address": "9475"}, "HOST:PORT", id="address without port"),
        pytest.param({"tls_cert_file": Path("c")}, "set together", id="cert without key"),
        pytest.param({"tls_client_ca_file": Path("ca")}, "needs tls_cert_file", id="ca alone"),
        pytest.param({"pod_resources_interval_s": 0.1}, "pod_resources_interval_s", id="fast poll"),
    ],
)
def test_config_validation(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MetricsSection(**fields)


def test_disabled_builds_an_idle_exporter_that_claims_no_port() -> None:
    config = AgentConfig(metrics=MetricsSection(enabled=False))
    exporter = build(config, SnapshotStore())
    assert isinstance(exporter, Idle)  # left out of the supervised set
    assert not isinstance(exporter, Preparable)  # the agent claims no metrics port for it


def test_component_renders_each_snapshot_once_and_serves_it(
    make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> None:
    node = make_node("dgx-h100")
    config = AgentConfig(metrics=MetricsSection(address="127.0.0.1:0", pod_attribution=False))
    snapshots = SnapshotStore()
    others_ready = threading.Event()
    others_ready.set()
    exporter = build(
        config, snapshots, ready_check=lambda: others_ready.is_set() and exporter.ready
    )
    assert isinstance(exporter, MetricsExporter)
    sampler = Sampler(node, snapshots, SamplerSection(interval_s=1.0))
    stop = threading.Event()
    thread = threading.Thread(target=exporter.run, args=(stop,))
    thread.start()
    try:
        sampler.sample_once()
        assert wait_until(lambda: exporter.ready)
        port = exporter.server.port  # type: ignore[union-attr]
        first = parse_samples(get(port, "/metrics")[2].decode())
        assert value(first, "nodeagent_gpus") == 8.0
        assert value(first, "nodeagent_gpu_row_remap_pending", gpu="2") == 0.0
        renders = exporter.renderer.renders
        for _ in range(3):  # scrapes of a rendered snapshot never render again
            get(port, "/metrics")
        assert exporter.renderer.renders == renders
        SimControl(sim_state_dir).inject("remap-pending", 2)
        sampler.sample_once()  # scrapes come often here: rendered ahead, on the exporter thread
        assert wait_until(lambda: exporter.renderer.renders == renders + 1)
        after = parse_samples(get(port, "/metrics")[2].decode())
        assert value(after, "nodeagent_gpu_row_remap_pending", gpu="2") == 1.0
        assert exporter.renderer.renders == renders + 1
        others_ready.clear()  # another component of the agent is not ready yet
        assert get(port, "/readyz")[0] == 503
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def test_component_renders_ahead_only_the_snapshots_the_next_scrape_may_serve(
    make_node: Callable[..., GpuNode],
) -> None:
    node = make_node("dgx-h100")
    config = AgentConfig(metrics=MetricsSection(address="127.0.0.1:0", pod_attribution=False))
    snapshots = SnapshotStore()
    now = [1000.0]
    exporter = MetricsExporter(config, snapshots, clock=lambda: now[0])
    sampler = Sampler(node, snapshots, SamplerSection(interval_s=1.0))

    def sample_at(t: float) -> None:
        now[0] = t
        sampler.sample_once()
        exporter.observe_latest()

    sample_at(1000.0)
    assert exporter.renderer.renders == 1  # no scrape seen yet: every snapshot is made ahead
    exporter.serve_latest()
    sample_at(1015.0)
    assert exporter.renderer.renders == 2  # one scrape: the cadence is not known yet
    exporter.serve_latest()  # scrapes 15 s apart: the next is due at 1030
    assert exporter.renderer.renders == 2  # served what was made ahead
    for t in range(1016, 1028):
        sample_at(float(t))
    assert exporter.renderer.renders == 2  # none of these can be the newest at 1030
    assert exporter.capacity is not None  # ... but each was observed
    sample_at(1028.0)
    sample_at(1029.0)
    assert exporter.renderer.renders == 4  # the last two before the scrape are made ahead
    now[0] = 1030.0
    served = exporter.serve_latest()
    assert served is not None
    assert served.generation == snapshots.generation
    assert exporter.renderer.renders == 4  # the scrape found its bytes made
    sample_at(1031.0)
    assert exporter.renderer.renders == 4  # the next scrape is due at 1045
    sample_at(1044.0)
    sample_at(1050.0)  # the scrape is overdue: every snapshot is made ahead
    assert exporter.renderer.renders == 6
    now[0] = 1051.0
    exporter.serve_latest()  # gaps 15, 15, 21: the next is expected at 1066
    sample_at(1052.0)
    assert exporter.renderer.renders == 6
    now[0] = 1053.0  # a scrape earlier than expected renders the newest snapshot itself
    early = exporter.serve_latest()
    assert early is not None
    assert early.generation == snapshots.generation
    assert exporter.renderer.renders == 7
