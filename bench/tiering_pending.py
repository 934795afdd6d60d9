"""Pending-workload diagnosis at scale: 5,000 nodes, 50,000 running pods, 2,000 pending GPU pods.

The pass is pure, so it is measured in process over a generated view, the way the service runs
it over its caches (nodes parsed once when they change, pods parsed on arrival):

- the full diagnosis pass (``Diagnoser(view).run()``: every pending GPU pod, plus the pool
  statistics the metrics export): median and p99 of ``--passes`` passes -- target p99 < 1 s;
- the same passes' CPU time (the machine is shared: wall time includes waiting for a core), and
  the load average at the end;
- the process RSS with the view built and the passes run -- target < 400 MB;
- baseline, same run: the naive per-pod scan (every pod against every node, nothing shared
  between pods; the MIG planner's per-layout answers are cached in both, since they do not
  depend on the pod), on every ``--naive-every``-th pending pod, scaled to all of them; both
  must give the same diagnoses.

The cluster: 40% 8x H100 NVSwitch nodes (tier training), 20% 8x L40S PCIe nodes (no NVLink,
tier general), 30% 8x H100 MIG nodes with a mix of the built-in layouts' shapes (tier shared),
10% of them cordoned or tainted; running pods fill 1-4 GPUs or one MIG instance each, the rest
of the 50,000 request no GPU; every node has at most 3 GPUs free, so most pending pods
are blocked. Pending pods: 8-, 4- and 2-GPU jobs (some asking for an NVLink
set), MIG requests of five profiles, a tenth held by Kueue's gate, with the node selectors and
tolerations of 12 teams.

Second part, ``nodeagent tiering simulate`` from a cluster file (issue 32: 10,000 pending
one-GPU pods on 4 nodes were killed after 30 s): a generated file of ``--file-pending`` pending
pods on 4 DGX H100 nodes, run ``--file-passes`` times in process, each run reading and
validating the file (:func:`load_cluster`, the project's YAML reader), building the simulated
nodes and running the pass -- target p99 < 5 s for the whole command. Baseline, same run, once:
the reader it replaced (PyYAML's pure-Python composer, then ``safe_load`` again for the data).

Third part, jobs waiting in Kueue (issue 27): ``--workloads`` suspended jobs' Workloads (10,000:
8- to 64-GPU jobs of 12 teams, each team's LocalQueue over its ClusterQueue, 3 cohorts of 4),
parsed as the service's informer parses them, over the same 5,000 nodes and 2,000 pending pods:
the whole pass (pods and Workloads), median and p99 -- target p99 < 1 s; baseline, same run: the
pass over the same view without the Workloads, so the ratio is what they add.

Run: ``.venv/bin/python bench/tiering_pending.py [--nodes 5000] [--pods 50000]
[--pending 2000] [--passes 30] [--workloads 10000] [--file-pending 10000] [--file-passes 5]
[--only-file 1]`` (about 4 minutes on a 2-core VM).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import yaml
from tiering_common import count_options, nearest_rank

from nodeagent import labels as lbl
from nodeagent.agent.backend import open_node
from nodeagent.agent.mig_planning import plan_for_diagnosis
from nodeagent.agent.simulated import SimulatedCluster
from nodeagent.gpu.types import MigGeometry
from nodeagent.published import PublishedGpu, PublishedInstance, PublishedNode, decode, encode
from nodeagent_tiering.cluster.clusterfile import ClusterFile, load_cluster
from nodeagent_tiering.cluster.nodes import Node, Taint
from nodeagent_tiering.cluster.view import (
    KUEUE_GATE,
    ClusterView,
    PodInfo,
    Scheduled,
    Toleration,
    cluster_queue_from_object,
    workload_from_object,
)
from nodeagent_tiering.pending.diagnosis import Diagnoser
from nodeagent_tiering.pending.results import Settings
from nodeagent_tiering.simulate import simulate

H100 = "NVIDIA H100 80GB HBM3"
L40S = "NVIDIA L40S"
# Per-GPU MIG layouts (profile, start) as the built-in layouts lay them out on an H100.
LAYOUTS = [
    [("1g.10gb", s) for s in range(7)],  # all-1g
    [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)],  # all-balanced
    [("3g.40gb", 0), ("3g.40gb", 4)],  # all-3g
    [("4g.40gb", 0), ("3g.40gb", 4)],
    [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4)],  # all-2g
]
TEAMS = 12


def h100_geometry() -> MigGeometry:
    with tempfile.TemporaryDirectory() as d, open_node("dgx-h100", Path(d)) as node:
        found = node.mig_geometry(0)
    assert found is not None
    return found


def mig_resource(profile: str) -> str:
    return f"nvidia.com/mig-{profile}"


def build(nodes: int, pods: int, pending: int, seed: int) -> ClusterView:
    rng = random.Random(seed)
    geo = h100_geometry()
    sizes = {p.name: p.placements[0].size for p in geo.profiles}
    infos: list[Node] = []
    running: list[PodInfo] = []
    n_pod = 0

    def run(node: str, request: dict[str, int]) -> None:
        nonlocal n_pod
        n_pod += 1
        running.append(
            PodInfo(f"team-{n_pod % TEAMS}", f"run-{n_pod}", f"u{n_pod}", node, "Running", request)
        )

    for i in range(nodes):
        name = f"node-{i:05d}"
        kind = i % 10
        taints: tuple[Taint, ...] = ()
        cordoned = rng.random() < 0.05
        if rng.random() < 0.05:
            taints = (Taint("pool", "reserved", "NoSchedule"),)
        if kind < 4 or kind == 9:  # H100 whole GPUs
            tier = "training"
            used = 0
            holders: dict[int, str] = {}
            target = rng.randint(5, 8)  # a busy pool: a few GPUs free per node at most
            while used < target:
                k = min(rng.choice([1, 2, 4, 4]), target - used)
                run(name, {"nvidia.com/gpu": k})
                for j in range(used, used + k):
                    holders[j] = f"{running[-1].namespace}/{running[-1].name}"
                used += k
            gpus = tuple(
                PublishedGpu(
                    j, H100, island=0, numa=j // 4, busy=j in holders, holder=holders.get(j)
                )
                for j in range(8)
            )
            state = PublishedNode(gpus, {}, True)
            allocatable = {"nvidia.com/gpu": 8}
        elif kind < 6:  # L40S, PCIe only: every GPU its own island
            tier = "general"
            used = rng.randint(6, 8)
            for _ in range(used):
                run(name, {"nvidia.com/gpu": 1})
            gpus = tuple(PublishedGpu(j, L40S, island=j, numa=j // 4) for j in range(8))
            state = PublishedNode(gpus, {}, False)
            allocatable = {"nvidia.com/gpu": 8}
        else:  # H100 MIG
            tier = "shared"
            allocatable = {}
            mig_gpus = []
            for j in range(8):
                layout = LAYOUTS[rng.randrange(len(LAYOUTS))]
                instances = []
                for profile, start in layout:
                    busy = rng.random() < 0.85
                    resource = mig_resource(profile)
                    allocatable[resource] = allocatable.get(resource, 0) + 1
                    if busy:
                        run(name, {resource: 1})
                    instances.append(PublishedInstance(profile, start, sizes[profile], busy, busy))
                mig_gpus.append(PublishedGpu(j, H100, island=0, numa=j // 4, mig=tuple(instances)))
            state = PublishedNode(tuple(mig_gpus), {H100: geo}, True)
        # What the service holds: the annotation decoded (shared geometry objects, as decode
        # interns them).
        state = decode(encode(state))
        infos.append(
            Node(
                name,
                labels={lbl.TIER: tier, "kubernetes.io/hostname": name, "team-pool": f"p{i % 3}"},
                taints=taints,
                unschedulable=cordoned,
                allocatable=allocatable,
                published=state,
            )
        )
    while len(running) < pods:  # the rest of the cluster's pods use no GPU
        n_pod += 1
        node = infos[n_pod % nodes].name
        running.append(
            PodInfo(f"team-{n_pod % TEAMS}", f"cpu-{n_pod}", f"u{n_pod}", node, "Running")
        )
    waiting = []
    message = "0/5000 nodes are available: 5000 Insufficient nvidia.com/gpu."
    for k in range(pending):
        team = k % TEAMS
        choice = rng.random()
        labels: dict[str, str] = {}
        selector: dict[str, str] = {}
        tolerations: tuple[Toleration, ...] = ()
        if choice < 0.25:
            request = {"nvidia.com/gpu": 8}
            selector = {lbl.TIER: "training"}
        elif choice < 0.45:
            request = {"nvidia.com/gpu": 4}
            selector = {"team-pool": f"p{team % 3}"}
        elif choice < 0.55:
            request = {"nvidia.com/gpu": 2}
            labels = {lbl.GPU_TOPOLOGY: "nvlink"}
        else:
            profile = rng.choice(["3g.40gb", "4g.40gb", "7g.80gb", "2g.20gb", "1g.20gb"])
            request = {mig_resource(profile): 1}
            selector = {lbl.TIER: "shared"}
        if team % 4 == 0:
            tolerations = (Toleration("pool", "Equal", "reserved", "NoSchedule"),)
        gates = (KUEUE_GATE,) if k % 10 == 0 else ()
        waiting.append(
            PodInfo(
                f"team-{team}",
                f"wait-{k}",
                f"w{k}",
                None,
                "Pending",
                request,
                selector,
                (),
                tolerations,
                labels,
                {},
                gates,
                Scheduled("False", "Unschedulable", message) if not gates else None,
            )
        )
    return ClusterView(tuple(infos), tuple(running + waiting))


def kueue_objects(count: int, seed: int) -> tuple[list[Any], dict[tuple[str, str], str], list[Any]]:
    """``count`` suspended jobs' Workloads as Kueue writes them (not admitted, Kueue's message),
    one LocalQueue per team, and the teams' ClusterQueues in 3 cohorts, parsed."""
    rng = random.Random(seed)
    gpu = "nvidia.com/gpu"
    queues = []
    for team in range(TEAMS):
        quota = {"name": gpu, "nominalQuota": 64, "lendingLimit": 16}
        queues.append(
            cluster_queue_from_object(
                {
                    "metadata": {"name": f"team-{team}"},
                    "spec": {
                        "cohortName": f"pool-{team % 3}",
                        "resourceGroups": [
                            {
                                "coveredResources": [gpu],
                                "flavors": [{"name": "h100", "resources": [quota]}],
                            }
                        ],
                    },
                    "status": {
                        "flavorsUsage": [
                            {
                                "name": "h100",
                                "resources": [{"name": gpu, "total": str(rng.randint(40, 64))}],
                            }
                        ]
                    },
                }
            )
        )
    local = {(f"team-{t}", "gpu"): f"team-{t}" for t in range(TEAMS)}
    workloads = []
    for k in range(count):
        team = k % TEAMS
        pods = rng.choice([1, 2, 4, 8])
        container = {"name": "main", "resources": {"requests": {gpu: "8"}}}
        message = (
            f"couldn't assign flavors to pod set main: insufficient unused quota for {gpu} "
            f"in flavor h100, {pods * 8} more needed"
        )
        workloads.append(
            workload_from_object(
                {
                    "metadata": {
                        "name": f"job-train-{k}-1a2b3",
                        "namespace": f"team-{team}",
                        "uid": f"wl-{k}",
                        "creationTimestamp": "2026-12-05T10:00:00Z",
                        "ownerReferences": [
                            {
                                "apiVersion": "batch/v1",
                                "kind": "Job",
                                "name": f"train-{k}",
                                "uid": f"job-{k}",
                            }
                        ],
                    },
                    "spec": {
                        "queueName": "gpu",
                        "podSets": [
                            {
                                "name": "main",
                                "count": pods,
                                "template": {"spec": {"containers": [container]}},
                            }
                        ],
                    },
                    "status": {
                        "conditions": [
                            {
                                "type": "QuotaReserved",
                                "status": "False",
                                "reason": "Pending",
                                "message": message,
                                "lastTransitionTime": "2026-12-05T10:00:00Z",
                            }
                        ]
                    },
                }
            )
        )
    return workloads, local, queues


def workload_part(view: ClusterView, count: int, passes: int, seed: int) -> None:
    print(f"jobs waiting in Kueue: {count} Workloads with no pod yet, over the same view")
    t = time.perf_counter()
    workloads, local, queues = kueue_objects(count, seed)
    print(f"  parse the Workloads and queues                      {time.perf_counter() - t:7.2f} s")
    with_jobs = replace(
        view,
        workloads=tuple(workloads),
        kueue=True,
        local_queues=local,
        cluster_queues=tuple(queues),
    )
    settings = Settings()
    measured: dict[str, list[float]] = {"with": [], "without": []}
    found = 0
    for _ in range(passes):  # interleaved, so both see the same machine
        for key, v in (("with", with_jobs), ("without", view)):
            t = time.perf_counter()
            result = Diagnoser(v, settings, plan_for_diagnosis).run()
            measured[key].append(time.perf_counter() - t)
            if key == "with":
                found = sum(1 for d in result.diagnoses if d.kind == "Job")
    assert found == count, found
    for key, label in (("with", "pods and Workloads"), ("without", "baseline: pods only")):
        times = measured[key]
        med, p99 = statistics.median(times), nearest_rank(times, 0.99)
        target = "  < 1 s" if key == "with" else ""
        print(f"  {label + ', median / p99 of ' + str(passes):52s}{med:7.3f} / {p99:.3f} s{target}")
    ratio = statistics.median(measured["with"]) / statistics.median(measured["without"])
    print(f"  the Workloads add                                   {ratio:7.2f}x the pass")


def cluster_file(path: Path, pending: int) -> None:
    """4 DGX H100 nodes and ``pending`` pods asking for one GPU each, none of them bound."""
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"job-{i}", "namespace": f"team-{i % TEAMS}"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "trainer:1",
                        "resources": {"limits": {"nvidia.com/gpu": 1}},
                    }
                ]
            },
        }
        for i in range(pending)
    ]
    nodes = [{"name": f"dgx-{i}", "preset": "dgx-h100"} for i in range(4)]
    # Block-style YAML, as people write it (and the slower form to read than JSON's flow).
    text = yaml.dump(
        {"version": "v1", "nodes": nodes, "pods": pods},
        Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
    )
    path.write_text(text)


def old_reader(path: Path) -> ClusterFile:
    """The cluster-file reader before issue 32: two pure-Python parses of the file."""
    text = path.read_text()
    yaml.compose(text)  # the line map
    return ClusterFile.model_validate(yaml.safe_load(text))


def simulate_once(path: Path, workdir: Path) -> tuple[float, float, float, int]:
    """Read, build, pass: the phases of ``tiering simulate --cluster``, in seconds."""
    t0 = time.perf_counter()
    cluster = load_cluster(path)
    t1 = time.perf_counter()
    sim = SimulatedCluster(cluster, path.parent, workdir)
    t2 = time.perf_counter()
    outcome = simulate(
        sim.node_objects(), sim.pod_objects(), sim.workload_objects(), None,
        plan_for_diagnosis, now_s=time.time(),
    )  # fmt: skip
    json.dumps(outcome.to_json())  # what --json prints
    return t1 - t0, t2 - t1, time.perf_counter() - t2, len(outcome.result.diagnoses)


def file_part(pending: int, passes: int) -> None:
    print(f"tiering simulate from a cluster file: 4 nodes, {pending} pending one-GPU pods")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cluster.yaml"
        cluster_file(path, pending)
        print(f"  file size                                           "
              f"{path.stat().st_size / 1e6:7.1f} MB")  # fmt: skip
        phases: list[tuple[float, float, float]] = []
        totals, cpu = [], []
        for n in range(passes):
            c = time.process_time()
            read, build_s, run_s, count = simulate_once(path, Path(d) / f"work-{n}")
            cpu.append(time.process_time() - c)
            assert count == pending, count
            phases.append((read, build_s, run_s))
            totals.append(read + build_s + run_s)

        def row(name: str, times: list[float], target: str = "") -> None:
            med, p99 = statistics.median(times), nearest_rank(times, 0.99)
            print(
                f"  {name + ', median / p99 of ' + str(passes):52s}{med:7.2f} / {p99:.2f} s{target}"
            )

        for i, name in enumerate(("read and validate the file", "simulated nodes", "the pass")):
            row(name, [p[i] for p in phases])
        row("whole command", totals, "  < 5 s")
        row("whole command CPU time", cpu)
        t = time.perf_counter()
        old_reader(path)
        old = time.perf_counter() - t
        ratio = old / statistics.median([p[0] for p in phases])
        print(f"  {'baseline: the old reader alone (pure-Python YAML)':52s}{old:7.2f} s"
              f"  ({ratio:.1f}x the new reader)")  # fmt: skip
        print(
            f"  load average at the end                             {psutil.getloadavg()[0]:7.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    count_options(parser, nodes=5000, pods=50000, pending=2000, passes=30, naive_every=20, seed=14)
    count_options(parser, file_pending=10000, file_passes=5, only_file=0, workloads=10000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} CPUs, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}, "
          f"libyaml {'yes' if hasattr(yaml, 'CSafeLoader') else 'no'}")  # fmt: skip
    if args.only_file:
        file_part(args.file_pending, args.file_passes)
        return
    proc = psutil.Process()
    started = time.perf_counter()
    print(f"pending-workload diagnosis: {args.nodes} nodes, {args.pods} running pods, "
          f"{args.pending} pending GPU pods")  # fmt: skip
    t = time.perf_counter()
    view = build(args.nodes, args.pods, args.pending, args.seed)
    print(f"  build the view (generated)                          {time.perf_counter() - t:7.2f} s")
    settings = Settings()
    first = Diagnoser(view, settings, plan_for_diagnosis).run()
    reasons: dict[str, int] = {}
    for d in first.diagnoses:
        reasons[d.reason.value] = reasons.get(d.reason.value, 0) + 1
    times = []
    cpu = []
    for _ in range(args.passes):
        t, c = time.perf_counter(), time.process_time()
        result = Diagnoser(view, settings, plan_for_diagnosis).run()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    assert len(result.diagnoses) == args.pending
    rss = proc.memory_info().rss / 1e6
    med, p99 = statistics.median(times), nearest_rank(times, 0.99)
    print(f"  full pass, median of {args.passes}                             {med:7.3f} s")
    print(f"  full pass, p99 of {args.passes}                                {p99:7.3f} s  < 1 s")
    print(f"  full pass, worst of {args.passes}                              {max(times):7.3f} s")
    print(f"  full pass CPU time, median / p99            {statistics.median(cpu):7.3f} / "
          f"{nearest_rank(cpu, 0.99):.3f} s")  # fmt: skip
    print(f"  load average while measuring                        {psutil.getloadavg()[0]:7.2f}")
    print(f"  RSS after the passes                                {rss:7.0f} MB  < 400 MB")
    print(f"  reasons: {', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))}")
    naive = Diagnoser(view, settings, plan_for_diagnosis, reuse=False)
    sample = naive.pending()[:: args.naive_every]
    t = time.perf_counter()
    slow = [naive.diagnose(p) for p in sample]
    spent = time.perf_counter() - t
    by_pod = {d.pod: d for d in first.diagnoses}
    assert all(d == by_pod[d.pod] for d in slow), "the naive scan disagrees"
    scaled = spent / len(sample) * args.pending
    print(f"  baseline: naive per-pod scan, {len(sample)} pods              {spent:7.2f} s")
    print(f"  baseline scaled to {args.pending} pods                          {scaled:7.1f} s"
          f"  ({scaled / med:.0f}x the pass)")  # fmt: skip
    workload_part(view, args.workloads, args.passes, args.seed)
    print(f"  (bench wall time {time.perf_counter() - started:.0f} s)")
    file_part(args.file_pending, args.file_passes)


if __name__ == "__main__":
    main()
