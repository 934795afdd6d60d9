"""Reading kube-apiserver's audit log (JSON lines) as the requests nodeagent's identities made.

Kept apart from the harness so that a benchmark can count a service's requests without loading
the harness (certificates, YAML) into the process it measures.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class AuditedRequest:
    """One API request from the audit log."""

    user: str
    verb: str  # get, list, watch, create, update, patch, delete, ...
    resource: str  # "nodes", "pods/eviction", "leases", ... ("" for non-resource URLs)
    namespace: str
    name: str
    code: int
    uri: str
    received_s: float = 0.0  # when kube-apiserver received it (epoch seconds, microseconds)


def audit_mark(path: Path) -> int:
    """A position in the audit log at ``path``; reading from it sees only later requests."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_audit(path: Path, since: int = 0, user: str | None = None) -> list[AuditedRequest]:
    """The requests logged after ``since`` (:func:`audit_mark`), optionally of one ``user``.

    A watch counts when its response starts; everything else when its response completes.
    """
    requests = []
    try:
        with path.open("rb") as log_file:
            # From the byte before the mark: a mark taken while a line was being written falls
            # inside that line, which is older than the mark and is skipped whole.
            log_file.seek(max(since - 1, 0))
            data = log_file.read()
    except FileNotFoundError:
        return []
    if since > 0:
        data = data[data.find(b"\n") + 1 :] if data[:1] != b"\n" else data[1:]
    # kube-apiserver may be writing the last line as it is read: only whole lines count, the
    # rest is read on the next call (an unterminated JSON line made a reader fail).
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    for line in lines:
        event = json.loads(line)
        stage, verb = event.get("stage"), event.get("verb", "")
        if not (stage == "ResponseComplete" and verb != "watch") and not (
            stage == "ResponseStarted" and verb == "watch"
        ):
            continue
        who = event.get("user", {}).get("username", "")
        if user is not None and who != user:
            continue
        ref = event.get("objectRef", {})
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        requests.append(
            AuditedRequest(
                user=who,
                verb=verb,
                resource=resource,
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                code=int(event.get("responseStatus", {}).get("code", 0)),
                uri=event.get("requestURI", ""),
                received_s=_epoch(event.get("requestReceivedTimestamp")),
            )
        )
    return requests


def _epoch(stamp: str | None) -> float:
    """An audit timestamp (RFC 3339 with microseconds) as epoch seconds; 0 when absent."""
    if not stamp:
        return 0.0
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
