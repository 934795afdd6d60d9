"""``nodeagent processes``: every compute process with its device, usage, pod and container."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from nodeagent.cli.common import (
    JsonOption,
    SimulateOption,
    StateDirOption,
    emit_json,
    fail,
    open_node_or_exit,
    print_table,
)
from nodeagent.config.metrics import DEFAULT_POD_RESOURCES_SOCKET
from nodeagent.gpu.errors import GpuError
from nodeagent.workloads import AttributedProcess, CgroupReader, attribute

MIB = 1024 * 1024


def process_to_json(p: AttributedProcess) -> dict[str, Any]:
    """The documented JSON shape of one process (docs/cli.md)."""
    w = p.workload
    return {
        "gpu": p.device.gpu_index,
        "gpu_uuid": p.device.gpu_uuid,
        "mig_device": p.device.mig_uuid,
        "mig_profile": p.device.mig_profile,
        "mig_instance": p.device.mig_instance,
        "pid": p.process.pid,
        "name": p.process.name,
        "type": "M+C" if p.process.mps_client else "C",
        "used_memory_bytes": p.process.used_memory_bytes,
        "sm_utilization_ratio": p.process.sm_utilization_ratio,
        "memory_utilization_ratio": p.process.memory_utilization_ratio,
        "namespace": w.namespace or None if w is not None else None,
        "pod": w.pod or None if w is not None else None,
        "container": w.container or None if w is not None else None,
        "pod_uid": w.pod_uid if w is not None else None,
        "container_id": w.container_id if w is not None else None,
        "attribution": p.source,
    }


def _row(p: AttributedProcess) -> list[str]:
    d, proc, w = p.device, p.process, p.workload
    mig = f"{d.mig_profile}/{d.mig_instance}" if d.mig_profile is not None else "-"
    memory = "-" if proc.used_memory_bytes is None else f"{proc.used_memory_bytes // MIB}MiB"
    sm = "-" if proc.sm_utilization_ratio is None else f"{proc.sm_utilization_ratio * 100:.0f}%"
    pod = container = "-"
    if w is not None:
        pod = f"{w.namespace}/{w.pod}" if w.named else f"uid {w.pod_uid}"
        container = w.container or (w.container_id or "-")[:12]
    return [
        str(d.gpu_index),
        mig,
        str(proc.pid),
        "M+C" if proc.mps_client else "C",
        proc.name or "-",
        memory,
        sm,
        pod,
        container,
    ]


def processes(
    simulate: SimulateOption = None,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
    proc_root: Annotated[
        Path,
        typer.Option("--proc-root", help="The host's /proc, where each process's cgroup is read."),
    ] = Path("/proc"),
    pod_resources_socket: Annotated[
        Path,
        typer.Option(
            "--pod-resources-socket",
            help="The kubelet's pod-resources socket; skipped when it does not exist.",
        ),
    ] = DEFAULT_POD_RESOURCES_SOCKET,
) -> None:
    """List the compute processes on the node's GPUs and MIG devices, with their pods.

    One row per process, as nvidia-smi's process table: GPU, MIG device, PID, type (C, or M+C
    for an MPS client), name, used GPU memory, SM utilization, and the pod and container where
    known (from the process's cgroup and the kubelet's pod-resources API).
    """
    if not proc_root.is_dir():
        fail(f"--proc-root {proc_root} is not a directory", "pass the host's /proc")
    # Imported here: grpc and the stubs are not needed for the table without a kubelet.
    from nodeagent_exporters.podresources import PodResourcesPoller

    holders: tuple[Any, ...] = ()
    if pod_resources_socket.exists():
        found = PodResourcesPoller(pod_resources_socket, 1.0).poll()
        if found is not None and found.ok:
            holders = found.pod_devices
    node = open_node_or_exit(simulate, state_dir)
    try:
        snapshot = node.snapshot()
    except GpuError as exc:
        fail(str(exc), "check the GPUs with `nodeagent gpus`", code=1)
    finally:
        node.close()
    rows = attribute(snapshot, holders, CgroupReader(proc_root))
    if as_json:
        emit_json([process_to_json(p) for p in rows])
        return
    if not rows:
        print("No compute processes.")
        return
    print_table(
        ["GPU", "MIG", "PID", "TYPE", "NAME", "MEMORY", "SM", "POD", "CONTAINER"],
        [_row(p) for p in rows],
    )
