"""The ``metrics`` section: the Prometheus exporter's HTTP server and pod attribution."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


@dataclass(frozen=True, slots=True)
class MetricsSection:
    """Where and how ``/metrics``, ``/healthz`` and ``/readyz`` are served."""

    enabled: bool = True
    address: str = "0.0.0.0:9475"  # HOST:PORT; --metrics-address overrides it
    tls_cert_file: Path | None = None  # serve HTTPS with this certificate (PEM)
    tls_key_file: Path | None = None  # its private key (PEM)
    tls_client_ca_file: Path | None = None  # require client certificates signed by this CA
    pod_attribution: bool = True  # label devices with the pod using them (kubelet pod-resources)
    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET  # kubelet pod-resources v1 socket
    pod_resources_interval_s: float = 10.0  # seconds between polls of that socket (min 1)

    def __post_init__(self) -> None:
        _host, sep, port = self.address.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(
                f"address {self.address!r} is not HOST:PORT; use e.g. 0.0.0.0:9475 or [::1]:9475"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file (HTTPS)")
        if not 1.0 <= self.pod_resources_interval_s <= 3600:
            raise ValueError(
                "pod_resources_interval_s must be between 1 and 3600, "
                f"got {self.pod_resources_interval_s}"
            )
