"""Preferred allocation of NVIDIA's device plugin and nodeagent's against the exhaustive optimum.

    python bench/peer_allocation.py [--presets dgx-h100,pcie-l40s]

Needs root and ``make nvidia-peers libnvml``, as bench/peer_device_plugin.py (whose helpers start
both plugins, each with its own test kubelet, on one simulated node). Every request goes to both
through ``GetPreferredAllocation``: sizes 2-7 on dgx-h100 (NVSwitch) and 2-4 on pcie-l40s (PCIe
switches, two NUMA nodes), on the whole node and on partly used nodes, where the GPUs in
``USED`` are left out of ``available_deviceIDs`` as the kubelet leaves out allocated ones.

The yardstick belongs to neither plugin. It is read from ``nodeagent topo --json`` (the
``nvidia-smi topo -m`` matrix of the simulated node) and scores only the chosen set:

- a pair of GPUs ranks by its link: NVLink (any count, NVSwitch included) 5, one PCIe switch
  (PIX) 4, several switches (PXB) 3, a host bridge (PHB) 2, within a NUMA node (NODE) 1, across
  NUMA nodes (SYS) 0;
- a set scores (sum of its pairs' ranks, minus the number of NUMA nodes it spans), compared in
  that order, so ties in links go to the set on fewer NUMA nodes.

Every candidate set of the request's size among the available GPUs is scored; the optimum is the
best. Per plugin: how many choices equal the optimum's score, the mean of (chosen rank sum /
optimum rank sum), and how many choices span the fewest NUMA nodes any candidate set spans. Sets
where the two plugins differ are listed. Unlike nodeagent's objective (docs/device-plugin.md), the
yardstick ignores what the choice leaves for later requests.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from peer_device_plugin import (
    NODEAGENT,
    RESOURCE,
    Running,
    gpu_uuids,
    nodeagent,
    nvidia,
    setup,
    stop_on_sigterm,
)

# Link ranks by the label of ``nodeagent topo`` (NV<n> for NVLink).
RANKS = {"PIX": 4, "PXB": 3, "PHB": 2, "NODE": 1, "SYS": 0}
NVLINK_RANK = 5

# Partly used nodes: GPUs already allocated (absent from available_deviceIDs).
# (0,) on pcie-l40s is issue 30's first case: both once chose {1, 4, 5} while {4, 5, 6} was free.
USED: tuple[tuple[int, ...], ...] = ((), (0,), (3,), (0, 5), (1, 2, 6), (4, 7))
SIZES = {"dgx-h100": range(2, 8), "pcie-l40s": range(2, 5)}


@dataclass(frozen=True)
class Topology:
    ranks: dict[tuple[int, int], int]
    numa: dict[int, int]

    @classmethod
    def read(cls, env: dict[str, str]) -> Topology:
        def run(*argv: str) -> object:
            out = subprocess.run(
                [str(NODEAGENT), *argv], env=env, capture_output=True, text=True, check=True
            )
            return json.loads(out.stdout)

        topo = run("topo", "--json")
        gpus = run("gpus", "--json")
        assert isinstance(topo, dict)
        assert isinstance(gpus, list)
        ranks: dict[tuple[int, int], int] = {}
        for link in topo["links"]:
            label = str(link["label"])
            rank = NVLINK_RANK if label.startswith("NV") else RANKS[label]
            ranks[(link["a"], link["b"])] = ranks[(link["b"], link["a"])] = rank
        return cls(ranks, {g["index"]: g["numa_node"] for g in gpus})

    def score(self, gpus: Iterable[int]) -> tuple[int, int]:
        chosen = sorted(gpus)
        links = sum(self.ranks[(a, b)] for a, b in itertools.combinations(chosen, 2))
        return links, -len({self.numa[g] for g in chosen})


@dataclass
class Request:
    used: tuple[int, ...]
    size: int
    optimum: tuple[int, int]
    fewest_numa: int
    chosen: dict[str, tuple[int, ...]]


def requests(preset: str, gpus: int) -> list[tuple[tuple[int, ...], list[int], int]]:
    out = []
    for used in USED:
        available = [g for g in range(gpus) if g not in used]
        for size in SIZES.get(preset, range(2, 5)):
            if size < len(available):
                out.append((used, available, size))
    return out


def ask(run: Running, uuids: list[str], available: list[int], size: int) -> tuple[int, ...]:
    ids = run.kubelet.preferred(RESOURCE, [uuids[g] for g in available], size)
    return tuple(sorted(uuids.index(i) for i in ids))


def measure(preset: str) -> tuple[Topology, list[Request]]:
    with tempfile.TemporaryDirectory(prefix="peer-alloc-", dir="/tmp") as tmp:
        work = Path(tmp)
        bin_dir, env, _state = setup(preset, work)
        topology = Topology.read(env)
        uuids = gpu_uuids(env)
        asked = requests(preset, len(uuids))
        results = []
        for used, available, size in asked:
            sets = [topology.score(s) for s in itertools.combinations(available, size)]
            results.append(Request(used, size, max(sets), min(-s[1] for s in sets), {}))
        for name in ("NVIDIA", "nodeagent"):
            plugin = (
                nvidia(bin_dir, env, work / "nvidia")
                if name == "NVIDIA"
                else nodeagent(env, work / "nodeagent")
            )
            with plugin as run:
                for request, (_used, available, size) in zip(results, asked, strict=True):
                    request.chosen[name] = ask(run, uuids, available, size)
    return topology, results


def report(preset: str, topology: Topology, results: list[Request]) -> None:
    n = len(results)
    print(f"\n{preset}: {n} requests (GPUs in use: {', '.join(str(u) for u in USED)})\n")
    print("| plugin | optimal | mean rank sum / optimum | fewest NUMA nodes |")
    print("|---|---|---|---|")
    for name in ("NVIDIA", "nodeagent"):
        scores = [topology.score(r.chosen[name]) for r in results]
        optimal = sum(s == r.optimum for s, r in zip(scores, results, strict=True))
        ratio = statistics.mean(
            s[0] / r.optimum[0] if r.optimum[0] else 1.0
            for s, r in zip(scores, results, strict=True)
        )
        fewest = sum(-s[1] == r.fewest_numa for s, r in zip(scores, results, strict=True))
        print(f"| {name} | {optimal}/{n} | {ratio:.4f} | {fewest}/{n} |")
    print("\nwhere the choices differ or miss the optimum (score = rank sum, NUMA nodes):\n")
    print("| in use | size | optimum | NVIDIA | nodeagent |")
    print("|---|---|---|---|---|")
    for r in results:
        a, b = r.chosen["NVIDIA"], r.chosen["nodeagent"]
        if a == b and topology.score(a) == r.optimum:
            continue

        def show(s: tuple[int, ...]) -> str:
            links, numa = topology.score(s)
            return f"{set(s)} {links}, {-numa}"

        opt = f"{r.optimum[0]}, {-r.optimum[1]}"
        print(f"| {set(r.used) or '-'} | {r.size} | {opt} | {show(a)} | {show(b)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--presets", default="dgx-h100,pcie-l40s")
    args = parser.parse_args()
    stop_on_sigterm()
    for preset in args.presets.split(","):
        topology, results = measure(preset)
        report(preset, topology, results)


if __name__ == "__main__":
    main()
