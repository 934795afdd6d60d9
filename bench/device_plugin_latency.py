"""Allocate and GetPreferredAllocation latency through the real unix socket.

Run: ``python bench/device_plugin_latency.py [--calls N]``. Baseline, measured in the same run:
the same service methods called in process (no gRPC, no socket), so the table shows what the
socket and gRPC add. Targets: p99 under 5 ms (Allocate) and 10 ms (GetPreferredAllocation).
"""

from __future__ import annotations

import argparse
import random
import time

from device_plugin_common import quantiles_ms, running, table

from nodeagent.kubelet.deviceplugin.v1beta1 import api_pb2


class _Ctx:
    """A stand-in servicer context for in-process baseline calls (never aborted here)."""

    def abort(self, code, details):
        raise RuntimeError(details)


def measure(bench, resource: str, calls: int, size: int, rng: random.Random):
    devices = sorted(bench.kubelet.wait_devices(resource))
    stub = bench.kubelet.stub(resource)
    service = bench.manager.servers[resource].service
    rows = []
    for name in ("Allocate", "GetPreferredAllocation"):
        socket_s, local_s = [], []
        for _ in range(calls):
            if name == "Allocate":
                ids = rng.sample(devices, size)
                request = api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
                )
                rpc, local = stub.Allocate, service.Allocate
            else:
                available = rng.sample(devices, rng.randint(size, len(devices)))
                request = api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available, allocation_size=size
                        )
                    ]
                )
                rpc, local = stub.GetPreferredAllocation, service.GetPreferredAllocation
            t0 = time.perf_counter()
            rpc(request, timeout=5)
            socket_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            local(request, _Ctx())
            local_s.append(time.perf_counter() - t0)
        med, p99 = quantiles_ms(socket_s)
        lmed, lp99 = quantiles_ms(local_s)
        rows.append((name, f"{med:.2f}", f"{p99:.2f}", f"{lmed:.2f}", f"{lp99:.2f}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    rng = random.Random(7)
    out = []
    with running("dgx-h100") as bench:
        for row in measure(bench, "nvidia.com/gpu", args.calls, 4, rng):
            out.append(("dgx-h100, 8 GPUs, size 4", *row))
    layout = {i: ["1g.10gb"] * 7 for i in range(8)}
    with running("dgx-h100", {"device_plugin": {"mig_strategy": "single"}}, mig=layout) as bench:
        for row in measure(bench, "nvidia.com/gpu", args.calls, 2, rng):
            out.append(("dgx-h100, 56 MIG devices, size 2", *row))
    headers = [
        "setup",
        "rpc",
        "socket median ms",
        "socket p99 ms",
        "in-process median ms",
        "in-process p99 ms",
    ]
    print(f"{args.calls} calls each")
    print(table(headers, out))


if __name__ == "__main__":
    main()
