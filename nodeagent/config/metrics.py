"""The ``metrics`` section: the Prometheus exporter's HTTP server and pod attribution."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, field_validator, model_validator

from nodeagent.config.errors import FieldError
from nodeagent.config.loader import Schema

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


class ProbeSection(Schema):
    """An optional canary on each shared GPU: a short command, its latency exported."""

    enabled: bool = Field(False, description="run the probe command on each shared device")
    command: tuple[str, ...] = Field(
        (),
        description="argv of a short GPU job; it runs with CUDA_VISIBLE_DEVICES set to the "
        "device's UUID (and NODEAGENT_PROBE_GPU to its index); exit 0 is a pass",
    )
    interval_s: float = Field(300.0, ge=10, le=86400, description="seconds between rounds")
    timeout_s: float = Field(30.0, ge=1, le=600, description="a run longer than this fails")

    @model_validator(mode="after")
    def _command_when_enabled(self) -> Self:
        if self.enabled and not self.command:
            found = FieldError()
            found.add("command", "an enabled probe needs a command, e.g. [/usr/bin/probe, --quick]")
            found.raise_any()
        return self


class MetricsSection(Schema):
    """Where and how ``/metrics``, ``/healthz`` and ``/readyz`` are served."""

    enabled: bool = Field(True, description="serve /metrics, /healthz and /readyz")
    address: str = Field(
        "0.0.0.0:9475",
        description="HOST:PORT (port 0: any free port); --metrics-address overrides it",
    )
    tls_cert_file: Path | None = Field(None, description="serve HTTPS with this certificate (PEM)")
    tls_key_file: Path | None = Field(None, description="its private key (PEM)")
    tls_client_ca_file: Path | None = Field(
        None, description="require client certificates signed by this CA"
    )
    pod_attribution: bool = Field(
        True, description="label devices with the pod using them (kubelet pod-resources)"
    )
    pod_resources_socket: Path = Field(
        DEFAULT_POD_RESOURCES_SOCKET, description="kubelet pod-resources v1 socket"
    )
    pod_resources_interval_s: float = Field(
        10.0, ge=1, le=3600, description="seconds between polls of that socket"
    )
    process_attribution: bool = Field(
        True,
        description="attribute each GPU process to its pod and container (cgroup, "
        "pod-resources, pods of this node from the API server) and export per-workload usage",
    )
    proc_root: Path = Field(
        Path("/proc"),
        description="the host's /proc (NVML reports host PIDs: in a pod, run with hostPID or "
        "mount the host's /proc here)",
    )
    max_workload_series: int = Field(
        1000, ge=1, le=100000, description="most (device, container) rows exported per render"
    )
    dcgm_compat: bool = Field(
        False,
        description="also serve dcgm-exporter's default families (DCGM_FI_*, its label names) "
        "from the same snapshot, for dashboards and alerts written against dcgm-exporter",
    )
    probe: ProbeSection = Field(default_factory=ProbeSection)

    @field_validator("address")
    @classmethod
    def _host_port(cls, address: str) -> str:
        _host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{address!r} is not HOST:PORT; use e.g. 0.0.0.0:9475 or [::1]:9475")
        return address

    @model_validator(mode="after")
    def _tls_files_together(self) -> Self:
        found = FieldError()
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            missing = "tls_key_file" if self.tls_key_file is None else "tls_cert_file"
            found.add(missing, "tls_cert_file and tls_key_file must be set together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            found.add("tls_client_ca_file", "needs tls_cert_file and tls_key_file (HTTPS) as well")
        found.raise_any()
        return self
