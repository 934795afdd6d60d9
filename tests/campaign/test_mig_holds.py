"""The `mig apply`-against-claims race: DRA claims prepared and unprepared while layouts are
applied, some of them with --force (issue 32, item 2).

One simulated node, two handles on it as two processes would have: the DRA driver's (a thread
preparing and unpreparing claims on random dynamic MIG devices, also whole GPUs) and the
applier's. Each *case* is one apply round, taken as `nodeagent mig apply` takes it: the node's
MIG lock (the one the driver makes instances under), the holds read under it, then a random
layout applied, partial or not, forced in about one round of six. The case survives when

* no instance a workload held when the round began is gone without --force, and every claim
  whose instance --force destroyed is marked failed in the DRA checkpoint;
* the checkpoint never points at a missing instance: every claim not marked failed has each of
  its MIG devices on the node (checked under the lock, where no prepare is half way);
* no driver call raised anything but a claim's own error.
"""

from __future__ import annotations

import collections
import random
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.gpu.node import GpuNode
from nodeagent.gpu.types import GpuInstance
from nodeagent.holds import CLAIM, HoldSources
from nodeagent.holds.dra_checkpoint import ClaimRecord, checkpoint_path, read_claims
from nodeagent.runtime.lock import ProcessLock
from nodeagent.testing.nodes import enable_mig
from nodeagent_dra.driver import ClaimRef, Driver
from nodeagent_dra.slices import SliceSpec, build_slices
from nodeagent_mig.apply import reconcile
from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config
from tests.campaign.conftest import Tally, size
from tests.dra.plugin_support import DRIVER, NODE, Claims, claim_json, make_driver

PRESET = "a30x4"  # four small GPUs: a round takes milliseconds
LAYOUTS = ("all-1g", "all-2g", "all-balanced", "all-4g", "all-enabled", "all-disabled")
FORCE_SHARE = 1 / 6
_MIG = re.compile(r"^gpu-(\d+)-mig-[a-z0-9-]+-(\d+)-(\d+)$")
_GPU = re.compile(r"^gpu-(\d+)$")


def claimable(node: GpuNode) -> list[str]:
    """Every device name a dynamic-MIG pool publishes on this node (MIG on, no instance)."""
    devices = build_slices(node.snapshot(), SliceSpec(NODE, DRIVER, dynamic_mig=True)).devices
    return sorted(n for n in devices if _MIG.match(n) or _GPU.match(n))


def dangling(node: GpuNode, records: dict[str, ClaimRecord]) -> list[str]:
    """The devices of claims not marked failed that the node no longer holds."""
    out = []
    for r in records.values():
        if r.failed:
            continue
        for d in r.devices:
            if d.mig is not None:
                gpu, ok = d.mig.gpu_index, _has(node, d.mig.gpu_index, d.mig.start, d.mig.profile)
            elif match := _MIG.match(d.device):
                gpu, profile_id, start = (int(g) for g in match.groups())
                ok = any(
                    g.placement.start == start and g.profile_id == profile_id
                    for g in _instances(node, gpu)
                )
            elif match := _GPU.match(d.device):
                gpu = int(match.group(1))
                # A whole GPU: with MIG off it is the GPU itself; with MIG on, its one instance.
                ok = not node.info(gpu).mig_enabled or bool(_instances(node, gpu))
            else:
                continue
            if not ok:
                out.append(
                    f"claim {r.namespace}/{r.name} (prepared: {r.prepared}) points at missing "
                    f"{d.device} (GPU {gpu}; {d.mig}); GPU {gpu} holds "
                    f"{[(g.slot.label, g.instance_id) for g in _instances(node, gpu)]}"
                )
    return out


def _instances(node: GpuNode, gpu: int) -> tuple[GpuInstance, ...]:
    return node.mig_instances(gpu) if node.info(gpu).mig_enabled else ()


def _has(node: GpuNode, gpu: int, start: int, profile: str) -> bool:
    return any(g.placement.start == start and g.profile == profile for g in _instances(node, gpu))


class ClaimChurn(threading.Thread):
    """Prepares and unprepares claims until stopped, like a kubelet with pods coming and going."""

    def __init__(self, driver: Driver, names: list[str], seed: int) -> None:
        super().__init__(name="claim-churn", daemon=True)
        self.driver = driver
        self.names = names
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.refs: list[ClaimRef] = []
        self.crashes: list[str] = []
        self.prepared = 0
        self.n = 0
        self.events: collections.deque[str] = collections.deque(maxlen=60)  # for a lost case

    def run(self) -> None:
        claims: Claims = self.driver.claims  # type: ignore[assignment]
        while not self.stop.is_set():
            try:
                if self.refs and (len(self.refs) > 6 or self.rng.random() < 0.4):
                    ref = self.refs.pop(self.rng.randrange(len(self.refs)))
                    error = self.driver.unprepare([ref])[ref.uid]
                    self.events.append(f"unprepare {ref.name}: {error or 'ok'}")
                    if error:
                        self.refs.append(ref)  # busy or the lock: the kubelet retries later
                else:
                    self.n += 1
                    # Mostly what the node publishes now (what a scheduler would allocate),
                    # sometimes a stale name (an allocation made before the last layout change).
                    published = self.driver.published() or {}
                    now = [n for n in self.names if n in published]
                    device = self.rng.choice(now if now and self.rng.random() < 0.8 else self.names)
                    ns, uid, name = claims.add(claim_json(f"c{self.n}", [("gpu", device)]))
                    ref = ClaimRef(ns, uid, name)
                    error = self.driver.prepare([ref])[uid].error
                    self.events.append(f"prepare {name} on {device}: {error or 'ok'}")
                    if error == "":
                        self.prepared += 1
                    self.refs.append(ref)  # unprepared later even when it failed, as kubelets do
            except Exception as exc:  # noqa: BLE001 - any escape is a defect the case reports
                self.crashes.append(f"{type(exc).__name__}: {exc}")
            self.stop.wait(0.002)


@pytest.mark.timeout(900)  # the long run (NODEAGENT_CAMPAIGN=long) takes minutes
def test_mig_apply_against_claims(
    tally: Tally, make_node: Callable[..., GpuNode], sim_state_dir: Path, tmp_path: Path
) -> None:
    rng = random.Random(3202)
    applier = make_node(PRESET)
    enable_mig(applier, {i: [] for i in range(applier.count())})
    names = claimable(applier)
    lock_file = tmp_path / "mig.lock"
    agent = tmp_path / "agent"
    driver = make_driver(
        make_node(PRESET, state_dir=sim_state_dir), tmp_path / "dra", Claims(), state_dir=agent
    )
    driver.mig_lock = ProcessLock(lock_file, "the node's MIG layout")
    sources = HoldSources.of_agent(agent, None, None)
    cfg = load_config(DEFAULT_CONFIG_FILE)
    churn = ClaimChurn(driver, names, rng.randrange(1 << 30))
    churn.start()
    held_rounds = forced_destroys = 0
    try:
        for case in range(size(30, 1000)):
            layout = rng.choice(LAYOUTS)
            force = rng.random() < FORCE_SHARE
            lock = ProcessLock(lock_file, "the node's MIG layout")
            lock.acquire(30)
            try:
                holds = sources.read()
                before = {
                    g.uuid: holds.of_instance(g)
                    for i in range(applier.count())
                    for g in _instances(applier, i)
                    if g.uuid is not None and holds.of_instance(g)
                }
                held_rounds += bool(before)
                report = reconcile(
                    applier, cfg, layout, state_dir=tmp_path / "mig", holds=holds,
                    force=force, allow_reset=True, partial=rng.random() < 0.5,
                )  # fmt: skip
                now = {g.uuid for i in range(applier.count()) for g in _instances(applier, i)}
                records = (
                    read_claims(checkpoint_path(agent)) if checkpoint_path(agent).exists() else {}
                )
                problems = dangling(applier, records)
                for uuid, holders in before.items():
                    if uuid in now:
                        continue
                    if not force:
                        problems.append(f"held instance {uuid} destroyed without force: {holders}")
                        continue
                    forced_destroys += 1
                    for h in holders:
                        record = records.get(h.uid)
                        if h.kind == CLAIM and record is not None and not record.failed:
                            problems.append(f"{h.label} lost its instance and is not failed")
                problems += [f"driver raised {c}" for c in churn.crashes]
                churn.crashes.clear()
            finally:
                lock.release()
            where = f"case {case} ({layout}{', force' if force else ''}): {report.summaries()}"
            if problems:
                tally.lose(f"{where}: {problems}; claims lately: {list(churn.events)}")
            else:
                tally.ok()
            churn.stop.wait(rng.uniform(0.01, 0.08))  # let claims come and go between rounds
    finally:
        churn.stop.set()
        churn.join(10)
    assert not churn.is_alive()
    # The race was really run: claims were prepared, and rounds met held instances.
    assert churn.prepared > 0
    assert held_rounds > 0
    print(
        f"mig-holds: {churn.prepared} claims prepared, {held_rounds} rounds met held instances, "
        f"{forced_destroys} held instances destroyed by --force"
    )
    tally.verify()
