"""The audit-log reader sees whole lines only: kube-apiserver may be writing one as it is read."""

from __future__ import annotations

import json
from pathlib import Path

from nodeagent.testing.kube.audit import audit_mark, read_audit


def _event(user: str) -> str:
    return json.dumps(
        {
            "stage": "ResponseComplete",
            "verb": "get",
            "user": {"username": user},
            "objectRef": {"resource": "leases"},
        }
    )


def test_a_line_still_being_written_is_read_once_whole(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_text(_event("a") + "\n" + _event("b")[:20])
    assert [r.user for r in read_audit(log)] == ["a"]
    mark = audit_mark(log)  # falls inside b's line
    with log.open("a") as out:
        out.write(_event("b")[20:] + "\n" + _event("c") + "\n")
    assert [r.user for r in read_audit(log, mark)] == ["c"], "b was logged before the mark"
    assert [r.user for r in read_audit(log)] == ["a", "b", "c"]
    after = audit_mark(log)
    with log.open("a") as out:
        out.write(_event("d") + "\n")
    assert [r.user for r in read_audit(log, after)] == ["d"]
