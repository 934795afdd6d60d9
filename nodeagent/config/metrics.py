"""The ``metrics`` section: the Prometheus exporter's HTTP server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class MetricsSection:
    """Where and how ``/metrics``, ``/healthz`` and ``/readyz`` are served."""

    enabled: bool = True
    address: str = "0.0.0.0:9475"  # HOST:PORT; --metrics-address overrides it
    tls_cert_file: Path | None = None  # serve HTTPS with this certificate (PEM)
    tls_key_file: Path | None = None  # its private key (PEM)
    tls_client_ca_file: Path | None = None  # require client certificates signed by this CA
