"""DRA claims of every wrong shape mixed with good ones in one call, and calls cut short by
their deadline: every claim gets exactly one answer, and nothing is ever half made.

The plugin runs on real sockets on a simulated H100 node of a dynamic-MIG pool and reads each
claim through its real API reader from a loopback server serving exactly the stored bytes.

*DRA claim shapes*: a case is one NodePrepareResources of good claims and malformed ones (a
field of the wrong type, missing or empty, opaque parameters of the wrong shape, an answer
that is not JSON, a device name this node never published, a reference without a UID), in a
random order. It survives when every claim has one answer, the good ones their device, every
bad one a one-line error of its own (never "failed unexpectedly", the mark of a defect); the
node then holds exactly the good claims' instances, CDI specs and checkpoint records; and an
unprepare of the whole call leaves the node as it was.

*Deadlines*: a case is one call of good, unknown and slow-to-read claims with a deadline of
50-500 ms. It survives when, after it, every checkpoint record is a prepared claim, the node's
instances and CDI specs are exactly those of the prepared claims (nothing half made), and the
next one-claim call is answered within 2 s.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from nodeagent.gpu.node import GpuNode
from nodeagent.testing.drakubelet import DraConnection, TestDraKubelet
from nodeagent.testing.nodes import enable_mig
from nodeagent_dra.driver import NOT_REACHED, Driver
from nodeagent_dra.resource_api import ApiClaims
from tests.campaign.conftest import Tally, size
from tests.dra.claim_api import ClaimApi, claim_api
from tests.dra.plugin_support import DRIVER, claim_json, make_driver, serve

# Devices no two good claims of a case share: whole GPUs 2-7 and the 1g slots of GPUs 0-1.
GOOD = [f"gpu-{i}" for i in range(2, 8)] + [
    f"gpu-{g}-mig-1g10gb-19-{s}" for g in (0, 1) for s in range(7)
]
SLICED = {
    "requests": ["r"],
    "opaque": {
        "driver": DRIVER,
        "parameters": {
            "apiVersion": "resource.nodeagent.io/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}},
        },
    },
}
_C = "status.allocation.devices.config[0]"
_P = f"{_C}.opaque.parameters"
_R = "status.allocation.devices.results[0]"
# path -> values that must make the claim fail (values that are fine there are not listed: an
# empty results list, another driver's name, a null sharing are all legal).
WRONG: dict[str, list[Any]] = {
    "metadata": [None, "x", 7, [], True],
    "metadata.uid": [None, 7, [], {}, "", "another-uid"],
    "metadata.name": [None, 7, [], "another-name"],
    "metadata.namespace": [None, 7.5, ["team-a"]],
    "status": [None, "x", 7, []],
    "status.allocation": [None, "x", 7, [], False],
    "status.allocation.devices": [None, "x", 7, []],
    "status.allocation.devices.results": [None, "x", 7, {}, {"0": {}}],
    _R: [None, "gpu-2", 7, [], {}],
    f"{_R}.device": [None, 7, [], "", "gpu-007", "gpu-\u0663", "gpu-\uff12", "gpu-99", "GPU-2",
                     " gpu-2", "gpu-2\n", "gpu-0-mig-1g10gb-19-7", "gpu-0-mig-7g80gb-0-0-0"],
    f"{_R}.request": [None, 7, [], ""],
    f"{_R}.driver": [None, 7, []],
    f"{_R}.pool": [None, 7, {}],
    "status.allocation.devices.config": [None, "x", 7, {}],
    _C: [None, "x", 7, []],
    f"{_C}.requests": [None, "r", 7, {}, [7]],
    f"{_C}.opaque": ["x", 7, []],
    f"{_C}.opaque.driver": [None, 7],
    _P: [None, "MPS", 7, [], True],
    f"{_P}.apiVersion": [None, "v1", 7],
    f"{_P}.kind": [None, "Pod", []],
    f"{_P}.sharing": ["x", 7, []],
    f"{_P}.sharing.strategy": [None, "Magic", 7, []],
    f"{_P}.sharing.timeSlicingConfig": ["x", 7, [], "", 0, False],
    f"{_P}.sharing.timeSlicingConfig.interval": [None, "Fast", 7, []],
}  # fmt: skip
BODIES = [b"", b"<html>502</html>", b"{", b"[]", b'"claim"', b"null", b"7", b"\xff\xfe", b"{}"]


def set_path(claim: dict[str, Any], path: str, value: Any) -> None:
    parts = path.replace("[", ".[").split(".")
    here: Any = claim
    for part in parts[:-1]:
        here = here[int(part[1:-1])] if part.startswith("[") else here[part]
    last = parts[-1]
    here[int(last[1:-1]) if last.startswith("[") else last] = value


@pytest.fixture
def rig(
    make_node: Callable[..., GpuNode], tmp_path: Path
) -> Iterator[tuple[GpuNode, Driver, DraConnection, ClaimApi]]:
    node = make_node("dgx-h100")
    enable_mig(node, {0: [], 1: []})
    with claim_api() as api:
        driver = make_driver(node, tmp_path, ApiClaims(api.api_client()))
        server = serve(driver, tmp_path)
        kubelet = TestDraKubelet(tmp_path / "plugins_registry")
        try:
            yield node, driver, kubelet.register(), api
        finally:
            kubelet.close()
            server.stop()


def mig_of(node: GpuNode) -> set[str]:
    return {f"gpu-{i}:{gi.slot.label}" for i in (0, 1) for gi in node.mig_instances(i)}


def expected_mig(devices: list[str]) -> set[str]:
    """The instances the MIG devices among ``devices`` are (1g slots only, see GOOD)."""
    out = set()
    for d in devices:
        if "-mig-" in d:
            out.add(f"gpu-{d.split('-')[1]}:1g.10gb@{d.rsplit('-', 1)[1]}:1")
    return out


def half_made(node: GpuNode, driver: Driver) -> list[str]:
    """What is on the node that no prepared claim accounts for (or a claim lacks)."""
    problems = []
    records = driver.checkpoint.claims
    problems += [f"record {uid} not prepared" for uid, r in records.items() if not r.prepared]
    devices = [d.device for r in records.values() for d in r.devices]
    if mig_of(node) != expected_mig(devices):
        problems.append(f"instances {sorted(mig_of(node))} for devices {sorted(devices)}")
    specs = {p.name for p in driver.cdi.spec_dir.glob("*.json")}
    wanted = {driver.cdi.spec_path(uid).name for uid, r in records.items() if r.devices}
    if specs != wanted:
        problems.append(f"CDI specs {sorted(specs)}, prepared {sorted(wanted)}")
    return problems


def one_line_error(error: str) -> str | None:
    """Why ``error`` is not a good claim error, or None."""
    if not error:
        return "no error"
    if "\n" in error or "Traceback" in error or len(error) > 600:
        return f"not one line: {error[:200]!r}"
    if "failed unexpectedly" in error:
        return f"a defect: {error}"
    return None


# The full sizes run for minutes (the CI sample for seconds).
@pytest.mark.timeout(900)
def test_dra_claim_shapes(
    rig: tuple[GpuNode, Driver, DraConnection, ClaimApi], tally: Tally
) -> None:
    node, driver, connection, api = rig
    rng = random.Random(32)
    paths = sorted(WRONG)
    for case in range(size(15, 800)):
        devices = rng.sample(GOOD, rng.randint(0, 3))
        refs: list[tuple[str, str, str]] = []
        good: dict[str, str] = {}
        bad: dict[str, str] = {}  # uid -> what was done to it
        for n, device in enumerate(devices):
            ref = api.add(claim_json(f"g{case}-{n}", [("r", device)], config=[SLICED]))
            refs.append(ref)
            good[ref[1]] = device
        for n in range(rng.randint(1, 4)):
            name = f"b{case}-{n}"
            claim = claim_json(
                name, [("r", rng.choice(GOOD))], config=[json.loads(json.dumps(SLICED))]
            )
            ref = api.add(claim)
            kind = rng.random()
            if kind < 0.75:
                path = rng.choice(paths)
                value = rng.choice(WRONG[path])
                set_path(claim, path, value)
                api.add_raw("team-a", name, json.dumps(claim).encode())
                what = f"{path}={value!r}"
            elif kind < 0.88:
                body = rng.choice(BODIES)
                api.add_raw("team-a", name, body)
                what = f"answer {body!r}"
            elif kind < 0.94:
                del api.answers[("team-a", name)]
                what = "not found"
            else:
                field = rng.randrange(3)
                ref = tuple("" if i == field else v for i, v in enumerate(ref))  # type: ignore[assignment]
                what = f"reference {ref}"
            refs.append(ref)
            bad[ref[1]] = what
        rng.shuffle(refs)
        label = f"case {case}: good {devices}, bad {list(bad.values())}"
        try:
            answers = connection.prepare(refs)
        except grpc.RpcError as exc:
            tally.lose(f"{label}: the call failed: {exc.code()} {exc.details()}")
            continue
        problems = []
        if set(answers) != {r[1] for r in refs}:
            problems.append(f"answered {sorted(answers)} for {sorted(r[1] for r in refs)}")
        for uid, device in good.items():
            got = answers.get(uid)
            if got is None or got.error or [d["device"] for d in got.devices] != [device]:
                problems.append(f"good {device}: {got}")
        for uid, what in bad.items():
            got = answers.get(uid)
            why = one_line_error(got.error) if got is not None else "no answer"
            if why is not None or (got is not None and got.devices):
                problems.append(f"bad ({what}): {why or got}")
        problems += half_made(node, driver)
        if set(driver.checkpoint.claims) != set(good):
            problems.append(f"checkpoint {sorted(driver.checkpoint.claims)}")
        try:
            undone = connection.unprepare(refs)
        except grpc.RpcError as exc:
            problems.append(f"unprepare failed: {exc.code()} {exc.details()}")
            undone = {}
        # A reference the kubelet left a field out of is refused again; every other succeeds.
        refused = {r[1] for r in refs if not all(r)}
        if any(error for uid, error in undone.items() if uid not in refused):
            problems.append(f"unprepare: {undone}")
        if mig_of(node) or driver.checkpoint.claims or list(driver.cdi.spec_dir.glob("*.json")):
            problems.append("unprepare left something behind")
        if problems:
            tally.lose(f"{label}: {problems[:3]}")
        else:
            tally.ok()
    tally.verify()


@pytest.mark.timeout(900)
def test_deadlines(rig: tuple[GpuNode, Driver, DraConnection, ClaimApi], tally: Tally) -> None:
    node, driver, connection, api = rig
    rng = random.Random(45)
    for case in range(size(4, 100)):
        refs = []
        for n, device in enumerate(rng.sample(GOOD, rng.randint(1, 6))):
            name = f"d{case}-{n}"
            refs.append(api.add(claim_json(name, [("r", device)])))
            api.delay_s[name] = rng.choice((0.0, 0.0, 0.05, 0.2, 0.6))
        refs += [
            ("team-a", f"u{case}-{n}", f"unknown-{case}-{n}") for n in range(rng.randint(0, 40))
        ]
        rng.shuffle(refs)
        deadline_s = rng.uniform(0.05, 0.5)
        label = f"case {case}: {len(refs)} claims, deadline {deadline_s * 1000:.0f} ms"
        problems = []
        try:
            answers = connection.prepare(refs, timeout_s=deadline_s)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                problems.append(f"the call failed: {exc.code()} {exc.details()}")
        else:
            for ref in refs:
                error = answers[ref[1]].error if ref[1] in answers else "no answer"
                if error and error != NOT_REACHED and "not found" not in error:
                    problems.append(f"{ref[2]}: {error}")
        # The next call: a claim of its own, on a device the first call did not name.
        free = [d for d in GOOD if d not in {d.device for r in driver.checkpoint.claims.values()
                                             for d in r.devices}]  # fmt: skip
        nxt = api.add(claim_json(f"next-{case}", [("r", free[0])]))
        started = time.monotonic()
        try:
            answer = connection.prepare([nxt], timeout_s=10)[nxt[1]]
            waited = time.monotonic() - started
            if answer.error or waited > 2.0:
                problems.append(f"next call: {answer.error or f'answered after {waited:.1f}s'}")
        except grpc.RpcError as exc:
            problems.append(f"next call failed: {exc.code()}")
        problems += half_made(node, driver)
        everything = [*refs, nxt]
        undone = connection.unprepare(everything)
        if any(undone.values()) or mig_of(node) or driver.checkpoint.claims:
            problems.append(f"cleanup: {undone}")
        if problems:
            tally.lose(f"{label}: {problems[:3]}")
        else:
            tally.ok()
    tally.verify()
