"""The DRA checkpoint file: its format, a round trip, and what a damaged file does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent_dra.checkpoint import (
    Checkpoint,
    ClaimRecord,
    MigIntent,
    MpsRecord,
    PreparedDevice,
    checkpoint_path,
    read_managed,
)

MIG = PreparedDevice(
    ("gpu",),
    "node-a",
    "gpu-0-mig-1g-6",
    ("k8s.gpu.nodeagent.io/claim=u1-0",),
    mig=MigIntent(0, "1g.10gb", 6, 1, instance_id=13, uuid="MIG-1"),
)
MPS = PreparedDevice(
    ("shared",),
    "node-a",
    "gpu-1",
    share_id="s1",
    mps=MpsRecord("GPU-1", 1, active_thread_percentage=50, pinned_memory_limit_mib=None),
)


def test_round_trip_and_the_format_on_disk(tmp_path: Path) -> None:
    path = checkpoint_path(tmp_path)
    written = Checkpoint.load(path)
    written.put(ClaimRecord("u1", "ns", "train", (MIG,), prepared=True, since_s=12.5))
    written.put(ClaimRecord("u2", "ns", "serve", (MPS,)))

    assert Checkpoint.load(path).claims == written.claims
    raw = json.loads(path.read_text())
    # The format earlier versions wrote, so a checkpoint survives an upgrade: the uid is the
    # key, the GPU index is "gpu".
    assert raw["version"] == 1
    assert raw["claims"]["u1"] == {
        "namespace": "ns",
        "name": "train",
        "devices": [
            {
                "requests": ["gpu"],
                "pool": "node-a",
                "device": "gpu-0-mig-1g-6",
                "cdi_ids": ["k8s.gpu.nodeagent.io/claim=u1-0"],
                "mig": {
                    "gpu": 0,
                    "profile": "1g.10gb",
                    "start": 6,
                    "size": 1,
                    "instance_id": 13,
                    "uuid": "MIG-1",
                },
                "share_id": None,
                "mps": None,
            }
        ],
        "prepared": True,
        "since_s": 12.5,
    }
    assert raw["claims"]["u2"]["devices"][0]["mps"] == {
        "uuid": "GPU-1",
        "gpu": 1,
        "active_thread_percentage": 50,
        "pinned_memory_limit_mib": None,
    }
    assert read_managed(tmp_path) == frozenset({(0, "1g.10gb", 6)})


def _good(tmp_path: Path) -> dict[str, object]:
    Checkpoint.load(checkpoint_path(tmp_path)).put(ClaimRecord("u1", "ns", "c", (MIG,), True))
    raw: dict[str, object] = json.loads(checkpoint_path(tmp_path).read_text())
    return raw


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        pytest.param(lambda raw: '{"version": 1, "claims": {', "Expecting", id="truncated"),
        pytest.param(lambda raw: json.dumps({**raw, "version": 2}), "version 2", id="version"),
        pytest.param(lambda raw: json.dumps([raw]), "version None", id="not-an-object"),
        pytest.param(lambda raw: json.dumps({"version": 1}), "no claims map", id="no-claims"),
        pytest.param(
            lambda raw: json.dumps(raw).replace('"gpu": 0', '"gpu": "zero"'), "gpu", id="bad-gpu"
        ),
        pytest.param(
            lambda raw: json.dumps(raw).replace('"pool": "node-a", ', ""), "pool", id="no-pool"
        ),
    ],
)
def test_a_damaged_file_is_set_aside_and_named_in_the_log(
    tmp_path: Path,
    damage: Callable[[dict[str, object]], str],
    named: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = checkpoint_path(tmp_path)
    damaged = damage(_good(tmp_path))
    path.write_text(damaged)

    assert read_managed(tmp_path) == frozenset()  # `dra slices` shows nothing as managed
    assert Checkpoint.load(path).claims == {}
    assert not path.exists()
    (aside,) = path.parent.glob("checkpoint.json.bad-*")
    assert aside.read_text() == damaged  # kept for the operator as it was, not deleted
    assert named in caplog.text
    assert str(aside) in caplog.text
