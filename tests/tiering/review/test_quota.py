"""The review's quota section on a simulated month, and on a small one Kueue really ran.

The simulated month (:mod:`nodeagent.testing.kueue_month`) holds the objects as the API server
would, and the truth they were made from; every number the review prints is computed here
again from the truth alone, minute by minute (the review sweeps the admissions' start and end
points instead), and must be equal.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import defaultdict
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from nodeagent.cli.tiering import app
from nodeagent.testing.kueue_month import MINUTE, Month, simulate, stamp
from nodeagent_tiering.cluster import kueue, units
from nodeagent_tiering.cluster.units import micro_time
from nodeagent_tiering.quota.apply import apply_objects
from nodeagent_tiering.quota.policy import render
from nodeagent_tiering.review.inputs import ReviewInputs, read_inputs
from nodeagent_tiering.review.quota import build_section
from tests.tiering.quota.conftest import KueueEnv, condition, quota_policy, wait_for


def inputs_of(month: Month) -> ReviewInputs:
    # What read_inputs hands over: the lists, as JSON round-trips them.
    def raw(objects):
        return json.loads(json.dumps(objects))

    return ReviewInputs(
        now_s=month.now_s,
        period_s=month.period_s,
        nodes=raw(month.nodes),
        pods=raw(month.pods),
        events=raw(month.events),
        kueue=kueue.KueueApi("v1beta2"),
        flavors=raw(month.flavors),
        cluster_queues=raw(month.cluster_queues),
        local_queues=raw(month.local_queues),
        workloads=raw(month.workloads),
    )


def expected_usage(month: Month) -> dict[str, tuple[float, float, float]]:
    """Per ClusterQueue: mean used, borrowed and lent GPUs over the period, minute by minute.

    Lent: at each minute, the cohort's borrowing (usage above nominal quota), capped by what
    its queues could lend, is shared among the queues with idle lendable quota in proportion
    to how much each could lend.
    """
    t0 = month.now_s - month.period_s
    minutes = int(month.period_s // MINUTE)
    used = {q: [0] * (minutes + 1) for q in month.queues}
    for run in month.runs:
        if run.admitted_s is None:
            continue
        start = max(run.admitted_s, t0)
        end = min(run.finished_s if run.finished_s is not None else month.now_s, month.now_s)
        if end <= start:
            continue
        used[run.queue][int((start - t0) // MINUTE)] += run.gpus
        used[run.queue][int((end - t0) // MINUTE)] -= run.gpus
    for series in used.values():
        for i in range(1, len(series)):
            series[i] += series[i - 1]
    sums = {q: [0.0, 0.0, 0.0] for q in month.queues}
    cohorts: dict[str, list[str]] = defaultdict(list)
    for name, q in month.queues.items():
        cohorts[q.tier].append(name)
    for members in cohorts.values():
        for m in range(minutes):
            borrowed = {}
            lendable = {}
            for name in members:
                q, u = month.queues[name], used[name][m]
                borrowed[name] = max(0, u - q.nominal)
                limit = q.lending_limit if q.lending_limit is not None else math.inf
                lendable[name] = min(max(0, q.nominal - u), limit)
            total_b, total_l = sum(borrowed.values()), sum(lendable.values())
            for name in members:
                sums[name][0] += used[name][m]
                sums[name][1] += borrowed[name]
                if total_l > 0:
                    sums[name][2] += min(total_b, total_l) * lendable[name] / total_l
    return {q: (s[0] / minutes, s[1] / minutes, s[2] / minutes) for q, s in sums.items()}


def nearest_rank(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(share * len(ordered)) - 1]


@pytest.mark.parametrize("seed", [7, 2024])
def test_the_review_of_a_simulated_month_equals_the_truth(seed):
    month = simulate(seed=seed, workloads=2500)
    section = build_section(inputs_of(month))
    rows = {(r.tier, r.team): r for r in section.rows}
    t0 = month.now_s - month.period_s
    usage = expected_usage(month)
    for name, q in month.queues.items():
        row = rows[(q.tier, q.team)]
        assert row.queues == [name]
        gpu = row.resources["nvidia.com/gpu"]
        assert gpu.guaranteed == q.nominal
        used, borrowed, lent = usage[name]
        assert gpu.used_avg == pytest.approx(used, rel=1e-9, abs=1e-9), name
        assert gpu.borrowed_avg == pytest.approx(borrowed, rel=1e-9, abs=1e-9), name
        assert gpu.lent_avg == pytest.approx(lent, rel=1e-9, abs=1e-9), name
        assert gpu.gpu_hours == pytest.approx(used * month.period_s / 3600, rel=1e-9)
        running = sum(r.gpus for r in month.runs if r.queue == name and r.ending == "running")
        assert (gpu.used_now, gpu.borrowed_now) == (running, max(0, running - q.nominal))
        runs = [r for r in month.runs if r.queue == name]
        waits = [r.wait_s for r in runs if r.admitted_s is not None and r.admitted_s >= t0]
        assert row.waits.admitted == len(waits)
        if waits:
            assert row.waits.median_s == statistics.median(waits)
            assert row.waits.p90_s == nearest_rank(waits, 0.9)
        pending = [month.now_s - r.queued_s for r in runs if r.ending == "pending"]
        assert row.waits.pending == len(pending)
        assert row.waits.longest_pending_s == (max(pending) if pending else None)
        ended = [r for r in runs if r.finished_s is not None and r.finished_s >= t0]
        assert row.failures.ended == sum(r.pods for r in ended)
        infra = [r for r in ended if r.ending in ("gpu-fault", "drain")]
        assert row.failures.infra == sum(r.pods for r in infra)
        assert row.failures.application == sum(r.pods for r in ended if r.ending == "application")
        causes: dict[str, int] = defaultdict(int)
        for r in infra:
            label = "GPU fault" if r.ending == "gpu-fault" else "drain"
            causes[f"{r.cause} ({label})"] += r.pods
        assert row.failures.causes == dict(causes)
        preempted: dict[str, int] = defaultdict(int)
        for r in runs:
            if r.preempted:
                preempted[r.preempted] += 1
        assert row.preemptions == dict(preempted)
    # Capacity behind the guarantees: the unstable node's 8 GPUs back nothing.
    first = month.node_tier[month.unstable]
    (backing,) = [b for b in section.backing if b.row.tier == first]
    installed = 8 * sum(1 for t in month.node_tier.values() if t == first)
    assert (backing.row.installed, backing.row.healthy) == (installed, installed - 8)
    promised = sum(q.nominal for q in month.queues.values() if q.tier == first)
    assert backing.row.promised == promised
    assert backing.row.backed == min(promised, installed - 8)
    assert backing.lost == [f"{month.unstable} unstable (GPUHealthy=False (Xid79))"]
    # Every tier's drains, as the service's DrainSucceeded Events say.
    drained = defaultdict(int)
    for node in month.drains:
        drained[month.node_tier[node]] += 3
    assert section.drains == dict(drained)


def test_what_to_change_names_idle_guarantees_unbacked_tiers_long_waits_and_stranding():
    month = simulate(seed=5, workloads=1500, sizes=((3, 50), (8, 50)))
    section = build_section(inputs_of(month))
    usage = expected_usage(month)
    t0 = month.now_s - month.period_s
    wanted = []
    first = month.node_tier[month.unstable]
    promised = sum(q.nominal for q in month.queues.values() if q.tier == first)
    installed = 8 * sum(1 for t in month.node_tier.values() if t == first)
    head = f"tier {first}: {promised} nvidia.com/gpu guaranteed on {first}, "
    if promised > installed:
        wanted.append(head + f"more than the {installed} its nodes have")
    elif promised > installed - 8:
        wanted.append(head + f"the healthy nodes hold {installed - 8} of {installed}")
    for name, q in month.queues.items():
        used = usage[name][0]
        if q.nominal >= 1 and used < 0.1 * q.nominal:
            wanted.append(f"team {q.team}, tier {q.tier}: uses ")
        waits = [
            r.wait_s
            for r in month.runs
            if r.queue == name and r.admitted_s is not None and r.admitted_s >= t0
        ]
        if waits and nearest_rank(waits, 0.9) > 3600:
            wanted.append(f"team {q.team}, tier {q.tier}: p90 queue wait")
    held: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in month.runs:
        if r.admitted_s is None:
            continue
        end = r.finished_s if r.finished_s is not None else month.now_s
        span = min(end, month.now_s) - max(r.admitted_s, t0)
        if span > 0:
            held[r.tier][1] += r.gpus * span
            held[r.tier][0] += r.gpus * span if r.per_pod == 3 else 0
    for tier, (three, total) in sorted(held.items()):
        if three / total >= 0.2:
            wanted.append(
                f"tier {tier}: {three / total:.0%} of admitted GPU time is 3-GPU pods on 8-GPU "
                "nodes: 2 fit per node and 2 GPUs stay stranded; ask for 1, 2, 4, 8 GPUs per pod"
            )
    assert len([w for w in wanted if "3-GPU pods" in w]) == 3, "every tier strands here"
    for line in wanted:
        assert any(f.startswith(line) for f in section.findings), (line, section.findings)


def test_the_section_renders_table_json_and_html_with_its_sources():
    month = simulate(seed=3, workloads=300)
    section = build_section(inputs_of(month))
    data = section.to_json()
    assert data["sources"]["guaranteed"].startswith("ClusterQueue spec")
    assert data["utilisation_source"] == "not queried (no --prometheus)"
    assert data["workloads_since"] == min(r.created_s for r in month.runs)
    titles = [t.title for t in section.tables()]
    assert titles[0].startswith("QUOTA AND QUEUES (last 30.0d; workloads since ")
    assert titles[1:] == ["CAPACITY BEHIND THE GUARANTEES", "WHAT TO CHANGE"]
    assert any(n.startswith("  guaranteed: ClusterQueue spec") for n in section.tables()[2].notes)
    page = section.html()
    assert "<script" not in page
    assert "<h2>Quota and queues</h2>" in page
    assert "Sources" in page


# --- a small month Kueue really ran -------------------------------------------------------------


def finish(env: KueueEnv, namespace: str, pod: str, *, failed: bool = False, evicted=False):
    """What the kubelet reports when a pod's container exits."""
    now = micro_time(time.time())[:19] + "Z"
    status: dict[str, Any] = {
        "phase": "Failed" if failed else "Succeeded",
        "containerStatuses": [
            {
                "name": "main",
                "image": "registry.invalid/workload:1",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 137 if failed else 0,
                        "reason": "Error" if failed else "Completed",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
        ],
    }
    if evicted:
        status["conditions"] = [
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
                "lastTransitionTime": now,
            },
        ]
    env.core.patch_namespaced_pod_status(pod, namespace, {"status": status})


def admitted_set(env: KueueEnv, namespace: str) -> set[str]:
    return {p for p, w in env.workloads(namespace).items() if condition(w, "Admitted") == "True"}


def test_the_review_of_a_month_kueue_ran_equals_the_objects(env, tmp_path):
    """Kueue admits, borrows and queues for real; the review, read through the same reader
    the command uses, must say what the objects say, computed here on its own."""
    tier = env.name("train")
    a, b = env.namespace("a"), env.namespace("b")
    data = {
        "version": "v1",
        "teams": [
            {
                "name": env.name("a"),
                "namespaces": [a],
                "tiers": {tier: {"resources": {"nvidia.com/gpu": {"guaranteed": 4}}}},
            },
            {
                "name": env.name("b"),
                "namespaces": [b],
                "tiers": {tier: {"resources": {"nvidia.com/gpu": {"guaranteed": 4, "borrow": 4}}}},
            },
        ],
    }
    policy = quota_policy(data)
    assert apply_objects(env.kube, env.api, render(policy, env.api)).ok
    node = env.node("n1", tier)
    env.pod(b, "b1", gpus=4, queue=tier)
    env.pod(b, "b2", gpus=4, queue=tier)
    wait_for(lambda: admitted_set(env, b) == {"b1", "b2"}, what="b to borrow a's idle 4")
    env.pod(a, "a1", gpus=4, queue=tier)  # a's quota is lent: it waits for b2
    wait_for(lambda: env.workloads(a).get("a1"), what="a1's Workload")
    time.sleep(2.2)  # a measurable wait (Kueue's timestamps are whole seconds)
    finish(env, b, "b2")
    wait_for(lambda: admitted_set(env, a) == {"a1"}, what="a1 admitted once b2 ended")
    wait_for(
        lambda: env.core.read_namespaced_pod("a1", a).status.phase == "Running", what="a1 to run"
    )
    # The node goes bad; the service drains it and a1 is evicted.
    when = micro_time(time.time())[:19] + "Z"
    env.core.create_namespaced_event(
        "default",
        {
            "metadata": {"generateName": f"{node}."},
            "involvedObject": {"kind": "Node", "name": node},
            "reason": "DrainStarted",
            "message": f"cordoned and draining (tier {tier}): GPUHealthy=False (Xid79): gone",
            "type": "Warning",
            "source": {"component": "nodeagent-tiering"},
            "firstTimestamp": when,
            "lastTimestamp": when,
            "count": 1,
        },
    )
    time.sleep(1.1)
    finish(env, a, "a1", failed=True, evicted=True)
    wait_for(lambda: condition(env.workloads(a)["a1"], "Finished") == "True", what="a1 finished")
    wait_for(lambda: condition(env.workloads(b)["b2"], "Finished") == "True", what="b2 finished")

    now = time.time()
    inputs = read_inputs(env.kube, now_s=now, period_s=3600)
    section = build_section(inputs, policy=policy)
    rows = {r.team: r for r in section.rows if r.tier == tier}

    # The expectation, from the objects alone.
    def interval(wl):
        conds = {c["type"]: c for c in wl["status"]["conditions"]}
        start = units.parse_time(conds["QuotaReserved"]["lastTransitionTime"])
        end = now
        if conds.get("Finished", {}).get("status") == "True":
            end = units.parse_time(conds["Finished"]["lastTransitionTime"])
        created = units.parse_time(wl["metadata"]["creationTimestamp"])
        return start, end, start - created

    spans = {
        team: {pod: interval(wl) for pod, wl in env.workloads(ns).items()}
        for team, ns in ((env.name("a"), a), (env.name("b"), b))
    }
    b1, b2 = spans[env.name("b")]["b1"], spans[env.name("b")]["b2"]
    a1 = spans[env.name("a")]["a1"]
    used_b = 4 * ((b1[1] - b1[0]) + (b2[1] - b2[0]))
    # b holds 8 (4 over its quota) while b1 and b2 overlap; a lends its idle 4 meanwhile.
    overlap = max(0.0, min(b1[1], b2[1]) - max(b1[0], b2[0]))
    gpu_a = rows[env.name("a")].resources["nvidia.com/gpu"]
    gpu_b = rows[env.name("b")].resources["nvidia.com/gpu"]
    assert gpu_b.used_avg == pytest.approx(used_b / 3600)
    assert gpu_b.borrowed_avg == pytest.approx(4 * overlap / 3600)
    assert gpu_a.lent_avg == pytest.approx(4 * overlap / 3600)
    assert gpu_a.used_avg == pytest.approx(4 * (a1[1] - a1[0]) / 3600)
    assert overlap >= 2, "b2 borrowed for the 2 s a1 waited"
    assert rows[env.name("a")].waits.median_s == a1[2]
    assert a1[2] >= 2
    assert rows[env.name("b")].waits.median_s == statistics.median([b1[2], b2[2]])
    assert (gpu_b.guaranteed, gpu_b.used_now, gpu_b.borrowed_now) == (4, 4, 0)
    failures_a = rows[env.name("a")].failures
    assert (failures_a.ended, failures_a.infra, failures_a.causes) == (1, 1, {"Xid79 (drain)": 1})
    failures_b = rows[env.name("b")].failures
    assert (failures_b.ended, failures_b.infra) == (1, 0)

    # The command prints it in every format.
    kubeconfig = str(env.plane.admin.path)
    quota_file = tmp_path / "quota.yaml"
    quota_file.write_text(yaml.safe_dump(data))
    base = ["report", "--kubeconfig", kubeconfig, "--quota", str(quota_file), "--since", "1h"]
    table = CliRunner().invoke(app, base)
    assert table.exit_code == 0, table.output
    assert "QUOTA AND QUEUES (last 60m;" in table.stdout
    line = next(x for x in table.stdout.splitlines() if x.startswith(tier) and env.name("a") in x)
    assert "Xid79 (drain) x1" in line
    as_json = CliRunner().invoke(app, [*base, "--json"])
    teams = {t["team"]: t for t in json.loads(as_json.stdout)["quota"]["teams"]}
    assert teams[env.name("a")]["failures"]["rate"] == 1.0
    page = tmp_path / "review.html"
    assert CliRunner().invoke(app, [*base, "--html", str(page)]).exit_code == 0
    assert "<h2>Quota and queues</h2>" in page.read_text()


def test_without_kueue_waits_come_from_pods_creation_to_start():
    """On a cluster without Kueue the waits are a GPU pod's creation to its start; the pods'
    nodes give the tier, their namespaces the team."""
    now = 1_767_225_600.0
    node = {"metadata": {"name": "n1", "labels": {"nodeagent.io/tier": "general"}}, "status": {}}

    def pod(name, ns, created, started=None, gpus="1", phase="Running"):
        status = {"phase": phase}
        if started is not None:
            status["startTime"] = stamp(started)
        return {
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": stamp(created)},
            "spec": {
                "nodeName": "n1" if started is not None else "",
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
            },
            "status": status,
        }

    waits = [30, 90, 600, 5, 3600]
    pods = [pod(f"p{i}", "ml", now - 7200, now - 7200 + w) for i, w in enumerate(waits)]
    pods.append(pod("cpu-only", "ml", now - 7200, now - 100, gpus="0"))
    pods.append(pod("waiting", "ml", now - 300, phase="Pending"))
    section = build_section(ReviewInputs(now_s=now, period_s=86400, nodes=[node], pods=pods))
    row = next(r for r in section.rows if r.team == "ml" and r.tier == "general")
    assert row.waits.source == "pods"
    assert row.waits.admitted == 5
    assert row.waits.median_s == statistics.median(waits)
    assert row.waits.p90_s == nearest_rank(waits, 0.9)
    (unplaced,) = [r for r in section.rows if r.tier == "(none)"]
    assert (unplaced.waits.pending, unplaced.waits.longest_pending_s) == (1, 300)
