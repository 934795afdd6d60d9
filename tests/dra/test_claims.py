"""Each claim of a call gets its own answer, whatever the API serves for it or its neighbours,
whenever the kubelet stops waiting, and whatever the disk under the state directory holds.

The plugin runs on real sockets and reads claims through its real API reader from a loopback
server that serves exactly the bytes a test stores (:mod:`tests.dra.claim_api`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from nodeagent.gpu.node import GpuNode
from nodeagent.testing.drakubelet import DraConnection, TestDraKubelet
from nodeagent.testing.nodes import enable_mig
from nodeagent_dra.checkpoint import Checkpoint, checkpoint_path
from nodeagent_dra.driver import NOT_REACHED, ClaimRef, Deadline, Driver
from nodeagent_dra.resource_api import ApiClaims
from tests.dra.claim_api import ClaimApi, claim_api
from tests.dra.plugin_support import DRIVER, NODE, claim_json, make_driver, serve
from tests.health.fulldisk import small_disk


@pytest.fixture
def h100(make_node: Callable[..., GpuNode]) -> GpuNode:
    """An H100 node of a dynamic-MIG pool: MIG on GPUs 0 and 1, GPUs 2-7 whole."""
    node = make_node("dgx-h100")
    enable_mig(node, {0: [], 1: []})
    return node


@pytest.fixture
def api() -> Iterator[ClaimApi]:
    with claim_api() as served:
        yield served


@pytest.fixture
def plugin(h100: GpuNode, tmp_path: Path, api: ClaimApi) -> Iterator[tuple[Driver, DraConnection]]:
    """The plugin on the H100 node reading claims from ``api`` (default request timeout)."""
    driver = make_driver(h100, tmp_path, ApiClaims(api.api_client()))
    server = serve(driver, tmp_path)
    kubelet = TestDraKubelet(tmp_path / "plugins_registry")
    try:
        yield driver, kubelet.register()
    finally:
        kubelet.close()
        server.stop()


def instances(node: GpuNode) -> dict[int, list[str]]:
    return {i: [gi.slot.label for gi in node.mig_instances(i)] for i in (0, 1)}


def with_path(claim: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``claim`` with the value at the dotted ``path`` (``[n]`` for list items) replaced."""
    parts = path.replace("[", ".[").split(".")
    here: Any = claim
    for part in parts[:-1]:
        here = here[int(part[1:-1])] if part.startswith("[") else here[part]
    last = parts[-1]
    if last.startswith("["):
        here[int(last[1:-1])] = value
    else:
        here[last] = value
    return claim


# (label, what to do to a good claim, the start of the claim's error after "is malformed: ")
SHAPES: list[tuple[str, str, Any, str]] = [
    ("results null", "status.allocation.devices.results", None,
     "status.allocation.devices.results: must be a list, not null"),
    ("result a string", "status.allocation.devices.results[0]", "gpu-2",
     "status.allocation.devices.results[0]: must be an object, not a string"),
    ("result without device", "status.allocation.devices.results[0]",
     {"request": "r", "driver": DRIVER, "pool": NODE},
     "status.allocation.devices.results[0].device: missing"),
    ("device a number", "status.allocation.devices.results[0].device", 7,
     "status.allocation.devices.results[0].device: must be a string, not a number"),
    ("metadata a list", "metadata", [], "metadata: must be an object, not a list"),
    ("allocation a string", "status.allocation", "yes",
     "status.allocation: must be an object, not a string"),
    ("config a mapping", "status.allocation.devices.config", {"opaque": {}},
     "status.allocation.devices.config: must be a list, not an object"),
]  # fmt: skip


def test_every_malformed_claim_fails_alone_naming_its_field(
    plugin: tuple[Driver, DraConnection], api: ClaimApi, h100: GpuNode
) -> None:
    """Issue 32: one malformed claim failed the whole call with grpc UNKNOWN ('NoneType'
    object is not iterable) and the good claims in it got no answer."""
    driver, connection = plugin
    good = [
        api.add(claim_json("good-gpu", [("r", "gpu-2")])),
        api.add(claim_json("good-mig", [("r", "gpu-0-mig-1g10gb-19-0")])),
    ]
    bad: dict[str, str] = {}
    refs = list(good)
    for n, (_label, path, value, error) in enumerate(SHAPES):
        claim = claim_json(f"bad-{n}", [("r", f"gpu-{n % 6 + 2}")])
        refs.append(api.add(claim))
        api.add_raw("team-a", f"bad-{n}", json.dumps(with_path(claim, path, value)).encode())
        bad[refs[-1][1]] = f"claim team-a/bad-{n} is malformed: {error}"
    params = claim_json(
        "params-string",
        [("r", "gpu-1-mig-1g10gb-19-0")],
        config=[{"opaque": {"driver": DRIVER, "parameters": "MPS please"}}],
    )
    refs.append(api.add(params))
    bad[refs[-1][1]] = (
        "claim team-a/params-string: status.allocation.devices.config[0]: "
        "opaque parameters must be an object, not a string"
    )
    api.add_raw("team-a", "not-json", b"<html>502 Bad Gateway</html>")
    refs.append(("team-a", "uid-not-json", "not-json"))
    bad["uid-not-json"] = "API server's answer for claim team-a/not-json is not JSON: "
    refs.append(("team-a", "", "no-uid"))
    bad[""] = "the kubelet's request names a claim without uid"

    answers = connection.prepare(refs)

    assert set(answers) == {ref[1] for ref in refs}, "every claim gets exactly one answer"
    for ref, device in zip(good, ("gpu-2", "gpu-0-mig-1g10gb-19-0"), strict=True):
        assert answers[ref[1]].error == ""
        assert [d["device"] for d in answers[ref[1]].devices] == [device]
    for uid, error in bad.items():
        assert answers[uid].error.startswith(error), (answers[uid].error, error)
        assert answers[uid].devices == []
    assert instances(h100) == {0: ["1g.10gb@0:1"], 1: []}, "only the good MIG claim made one"
    assert set(driver.checkpoint.claims) == {good[0][1], good[1][1]}
    # Unprepare: the same refs, good and bad, each answered; nothing is left.
    assert connection.unprepare(refs) == {
        **{ref[1]: "" for ref in refs if ref[1]},
        "": "the kubelet's request names a claim without uid",
    }
    assert instances(h100) == {0: [], 1: []}
    assert driver.checkpoint.claims == {}
    assert not list(driver.cdi.spec_dir.glob("*.json"))


@pytest.mark.parametrize(
    ("sharing", "error"),
    [
        ({"strategy": "MPS", "mpsConfig": ["defaultActiveThreadPercentage"]},
         "sharing.mpsConfig must be an object, not a list"),
        # Empty is not absent: the campaign found an empty list taken for no config at all.
        ({"strategy": "MPS", "mpsConfig": []}, "sharing.mpsConfig must be an object, not a list"),
        ({"strategy": "TimeSlicing", "timeSlicingConfig": ""},
         "sharing.timeSlicingConfig must be an object, not a string"),
        ({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": True}},
         "mpsConfig.defaultActiveThreadPercentage True must be 1..100"),
    ],
)  # fmt: skip
def test_a_wrong_parameter_inside_sharing_names_the_config_entry(
    plugin: tuple[Driver, DraConnection], api: ClaimApi, sharing: dict[str, Any], error: str
) -> None:
    _, connection = plugin
    other = {"opaque": {"driver": "gpu.nvidia.com", "parameters": "not ours to judge"}}
    ours = {
        "requests": ["r"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "resource.nodeagent.io/v1beta1",
                "kind": "GpuConfig",
                "sharing": sharing,
            },
        },
    }
    ref = api.add(claim_json("c", [("r", "gpu-3")], config=[other, ours]))
    assert connection.prepare([ref])[ref[1]].error == (
        f"claim team-a/c: status.allocation.devices.config[1]: {error}"
    )


UNPUBLISHED = (
    "gpu-007",  # GPU 7 with leading zeros
    "gpu-\u0663",  # an Arabic-Indic 3
    "gpu-\u0660",  # an Arabic-Indic 0: GPU 0 is dynamic MIG, its whole GPU is 7g.80gb
    "gpu-\uff11",  # a fullwidth 1
    "gpu-01",
    "gpu-1-mig-3g40gb-09-04",  # a real placement, zero-padded
    "gpu-1-mig-3g40gb-9-4 ",
    "gpu-8",  # no such GPU
)


def test_only_device_names_this_node_published_are_prepared(
    plugin: tuple[Driver, DraConnection], api: ClaimApi, h100: GpuNode
) -> None:
    """Issue 32: ``gpu-007`` prepared GPU 7, ``gpu-٣`` GPU 3 under CDI id ``...-gpu-_``, and on
    the dynamic-MIG pool such a name created a ``7g.80gb`` instance."""
    driver, connection = plugin
    refs = [api.add(claim_json(f"c{n}", [("r", name)])) for n, name in enumerate(UNPUBLISHED)]
    answers = connection.prepare(refs)
    for ref, name in zip(refs, UNPUBLISHED, strict=True):
        assert answers[ref[1]].error == (
            f"device {name!r} is not one this node publishes (driver {DRIVER}, pool {NODE})"
        )
    assert instances(h100) == {0: [], 1: []}, "no instance was created"
    assert driver.checkpoint.claims == {}
    assert not list(driver.cdi.spec_dir.glob("*.json"))
    # The published spellings of the same devices are prepared.
    published = [api.add(claim_json(f"p{n}", [("r", d)])) for n, d in
                 enumerate(("gpu-7", "gpu-3", "gpu-1-mig-3g40gb-9-4"))]  # fmt: skip
    assert {uid: a.error for uid, a in connection.prepare(published).items()} == {
        ref[1]: "" for ref in published
    }
    assert instances(h100) == {0: [], 1: ["3g.40gb@4:4"]}


def test_a_call_past_its_deadline_stops_and_does_not_hold_up_the_next(
    plugin: tuple[Driver, DraConnection], api: ClaimApi, h100: GpuNode
) -> None:
    """Issue 32: after a call of 400 unknown claims with a 3 s deadline, the next one-claim
    call waited 15.4 s (the first kept reading claims one by one under the driver's lock)."""
    driver, connection = plugin
    api.delay_s["*"] = 0.05  # each read: 50 ms (400 in turn: 20 s)
    unknown = [("team-a", f"uid-{n}", f"unknown-{n}") for n in range(400)]
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as raised:
        connection.prepare(unknown, timeout_s=1.0)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    good = api.add(claim_json("next", [("r", "gpu-1-mig-1g10gb-19-6")]))
    answer = connection.prepare([good], timeout_s=5.0)[good[1]]
    waited = time.monotonic() - started
    assert answer.error == ""
    assert waited < 2.5, f"the next call was answered {waited:.1f}s after the first began"
    reads = api.reads
    time.sleep(0.3)
    assert api.reads == reads < 300, f"{api.reads} reads: the first kept reading past its deadline"
    assert set(driver.checkpoint.claims) == {good[1]}, "nothing of the first call was recorded"
    assert instances(h100) == {0: [], 1: ["1g.10gb@6:1"]}


def test_claims_not_reached_by_the_deadline_get_their_own_error_and_nothing_half_made(
    h100: GpuNode, tmp_path: Path, api: ClaimApi, caplog: pytest.LogCaptureFixture
) -> None:
    driver = make_driver(h100, tmp_path, ApiClaims(api.api_client()))
    fast = [api.add(claim_json(f"fast-{n}", [("r", f"gpu-0-mig-1g10gb-19-{n}")])) for n in (0, 1)]
    slow = api.add(claim_json("slow", [("r", "gpu-1-mig-7g80gb-0-0")]))
    api.delay_s["slow"] = 3.0
    refs = [ClaimRef(*r) for r in (fast[0], slow, fast[1])]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="nodeagent_dra.driver"):
        out = driver.prepare(refs, Deadline.within(1.0))
    assert time.monotonic() - started < 1.5, "the call ended at its deadline"
    assert [r.getMessage() for r in caplog.records] == [
        "prepare: the kubelet's deadline passed before 1 claim(s) were reached (team-a/slow); "
        "nothing was done for them, the kubelet retries"
    ]
    assert out[fast[0][1]].error == out[fast[1][1]].error == ""
    assert out[slow[1]].error == NOT_REACHED
    assert instances(h100) == {0: ["1g.10gb@0:1", "1g.10gb@1:1"], 1: []}
    assert all(r.prepared for r in driver.checkpoint.claims.values())
    # A call whose deadline passed before it began does nothing at all.
    late = api.add(claim_json("late", [("r", "gpu-4")]))
    out = driver.prepare([ClaimRef(*late)], Deadline(at=time.monotonic()))
    assert out[late[1]].error == NOT_REACHED
    assert late[1] not in driver.checkpoint.claims
    assert driver.unprepare([ClaimRef(*fast[0])], Deadline(at=time.monotonic())) == {
        fast[0][1]: NOT_REACHED
    }
    assert instances(h100)[0] == ["1g.10gb@0:1", "1g.10gb@1:1"], "not unprepared half way"


def test_a_slow_api_server_does_not_push_nine_claims_past_the_kubelets_45s(
    plugin: tuple[Driver, DraConnection], api: ClaimApi
) -> None:
    """Issue 32: claims were read one after another, so nine reads at the default 5 s request
    timeout took the whole 45 s the kubelet allows. They are read concurrently now."""
    _, connection = plugin
    api.delay_s["*"] = 1.5
    refs = [api.add(claim_json(f"c{n}", [("r", f"gpu-{n + 2}")])) for n in range(6)]
    refs += [api.add(claim_json(f"m{n}", [("r", f"gpu-0-mig-1g10gb-19-{n}")])) for n in range(3)]
    started = time.monotonic()
    answers = connection.prepare(refs)
    took = time.monotonic() - started
    assert {uid: a.error for uid, a in answers.items()} == {ref[1]: "" for ref in refs}
    assert took < 5.0, f"nine claims took {took:.1f}s (one after another: 13.5 s)"
    assert api.most_in_flight >= 8


def test_an_api_server_that_never_answers_costs_a_call_two_request_timeouts(
    h100: GpuNode, tmp_path: Path, api: ClaimApi
) -> None:
    """Nine reads, eight at a time, each cut at the request timeout (1 s here, 5 s by default:
    10 s for the call, where reading in turn took 45 s)."""
    driver = make_driver(h100, tmp_path, ApiClaims(api.api_client(), request_timeout_s=1.0))
    api.delay_s["*"] = 30.0
    refs = [ClaimRef(*api.add(claim_json(f"c{n}", [("r", "gpu-2")]))) for n in range(9)]
    started = time.monotonic()
    out = driver.prepare(refs)
    assert time.monotonic() - started < 3.0
    assert {uid: o.error for uid, o in out.items()} == {
        ref.uid: f"API server did not answer within 1.0s reading claim team-a/{ref.name}; "
        "the kubelet retries"
        for ref in refs
    }


def test_the_time_slice_interval_a_claim_asks_is_logged_as_not_set(
    plugin: tuple[Driver, DraConnection], api: ClaimApi, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 32: the interval reached the container but was not set on the GPU, silently.
    NVML has no call for it (docs/dra.md): the operator is told, per claim and device."""
    driver, connection = plugin
    sliced = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
            },
        }
    }
    ref = api.add(claim_json("sliced", [("r", "gpu-5")], config=[sliced]))
    with caplog.at_level(logging.WARNING, logger="nodeagent_dra.driver"):
        assert connection.prepare([ref])[ref[1]].error == ""
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "claim team-a/sliced asks time-slice interval Long on gpu-5: the GPU's time-slice is "
        "not set by the driver (NVML has no call for it; docs/dra.md says what to do)"
    ]
    env = json.loads(driver.cdi.spec_path(ref[1]).read_text())["devices"][0]["containerEdits"]
    assert "NODEAGENT_SHARING=TimeSlicing" in env["env"]


# --- a full disk under the state directory --------------------------------------------------


def test_a_full_state_disk_fails_the_claim_alone_and_leaves_no_instance(
    h100: GpuNode, tmp_path: Path, api: ClaimApi
) -> None:
    """Issue 32: with the state directory on a full 64 KiB tmpfs, a prepare ended in an
    OSError traceback from the checkpoint write and could leave its instance behind."""
    with small_disk(64) as disk:
        state = disk.path / "state"
        driver = make_driver(h100, tmp_path, ApiClaims(api.api_client()), state_dir=state)
        server = serve(driver, tmp_path)
        kubelet = TestDraKubelet(tmp_path / "plugins_registry")
        try:
            connection = kubelet.register()
            kept = api.add(claim_json("kept", [("r", "gpu-0-mig-3g40gb-9-4")]))
            assert connection.prepare([kept])[kept[1]].error == ""
            disk.fill()
            mig = api.add(claim_json("mig", [("r", "gpu-1-mig-2g20gb-14-2")]))
            whole = api.add(claim_json("whole", [("r", "gpu-4")]))
            answers = connection.prepare([mig, whole])
            path = checkpoint_path(state)
            for ref in (mig, whole):
                error = answers[ref[1]].error
                assert error.startswith(f"claim team-a/{ref[2]} not prepared: cannot write {path}:")
                assert "the file system is full" in error
                assert error.endswith("nothing was left behind, the kubelet retries")
                assert not driver.cdi.spec_path(ref[1]).exists()
            assert instances(h100) == {0: ["3g.40gb@4:4"], 1: []}, "no instance left behind"
            assert set(driver.checkpoint.claims) == {kept[1]}
            assert disk.stray_files() == []
            # Unprepare on the full disk: the instance goes, the claim is kept until written.
            error = connection.unprepare([kept])[kept[1]]
            assert error.startswith(f"claim team-a/kept unprepared, but not forgotten: cannot "
                                    f"write {path}: the file system is full")  # fmt: skip
            assert instances(h100) == {0: [], 1: []}
            disk.free()
            assert connection.unprepare([kept]) == {kept[1]: ""}
            assert Checkpoint.load(path).claims == {}, "the retry wrote the checkpoint"
            answers = connection.prepare([mig, whole])
            assert {uid: a.error for uid, a in answers.items()} == {mig[1]: "", whole[1]: ""}
            assert instances(h100) == {0: [], 1: ["2g.20gb@2:2"]}
            assert set(Checkpoint.load(path).claims) == {mig[1], whole[1]}
            assert connection.unprepare([mig, whole]) == {mig[1]: "", whole[1]: ""}
        finally:
            kubelet.close()
            server.stop()
