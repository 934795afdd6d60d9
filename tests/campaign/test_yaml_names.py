"""Two case families of issue 32: the YAML reader's limits, and Kubernetes' name rules.

**YAML limits.** Every reader of the project (agent config with its pools, mig-parted layouts
and hooks, tier policy, quota policy, the simulator's cluster file) is given alias bombs of
random fan-out and height, lists and mappings nested past the depth limit, files past the size
limit and files with a byte that is not UTF-8. A case survives when the reader refuses it with
its documented error, in one line that names the file and the limit (or the bad byte), within
a few seconds; a bomb too small to break the alias limit may also be read, or refused for what
it holds. Anything else (a traceback, a hang, a second line, a wrong reason) is lost.

**Name rules.** Fuzzed label keys, label values, DNS labels and subdomains, and quantities --
mostly near-misses of valid ones -- go through the project's validators
(:mod:`nodeagent.config.types`, :mod:`nodeagent.config.quantity`) and through a cluster file.
A case survives when the validator accepts exactly what an independent, character-by-character
reading of Kubernetes' rules accepts (for quantities: the API's grammar, the value the
Kubernetes client computes, int64), refusing with one line, never another exception; and the
cluster file holding the name is read or refused in one line naming the field.
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity as client_parse_quantity

from nodeagent.config import yamlfile
from nodeagent.config.errors import ConfigError
from nodeagent.config.quantity import MAX, QuantityError, parse_quantity
from nodeagent.config.schema import load_agent_config
from nodeagent.config.types import any_label_value, dns_label, dns_subdomain, label_key
from nodeagent_mig.config import load_config, load_hooks
from nodeagent_tiering.cluster import clusterfile
from nodeagent_tiering.cluster.clusterfile import ClusterFileError, load_cluster, parse_cluster
from nodeagent_tiering.cluster.tier_policy import load_policy
from nodeagent_tiering.quota.policy import QuotaPolicyError, load_quota_policy
from tests.campaign.conftest import Tally, size

SECONDS = 5.0  # a refused file is refused at once; a loaded CI host gets some slack


def _one_line(load: Callable[[Path], Any]) -> Callable[[Path], str | None]:
    """The reader as ``path -> None`` (read) or its one error text; other exceptions escape."""

    def read(path: Path) -> str | None:
        try:
            load(path)
        except ConfigError as exc:
            return "\n".join(str(p) for p in exc.problems)
        except (ClusterFileError, QuotaPolicyError) as exc:
            return str(exc)
        return None

    return read


# reader, its limits, and the start of a file of its kind (a bomb or a deep value goes after)
READERS: list[tuple[str, Callable[[Path], str | None], yamlfile.Limits, str]] = [
    ("agent-config", _one_line(lambda p: load_agent_config(p, environ={})), yamlfile.CONFIG,
     "version: v1\nnode: {name: n1, pool: p}\n"),
    ("mig-layouts", _one_line(load_config), yamlfile.CONFIG, "version: v1\n"),
    ("mig-hooks", _one_line(load_hooks), yamlfile.CONFIG, "version: v1\n"),
    ("tier-policy", _one_line(load_policy), yamlfile.CONFIG, "version: v1\n"),
    ("quota-policy", _one_line(load_quota_policy), yamlfile.CONFIG, "version: v1\n"),
    ("cluster-file", _one_line(load_cluster), clusterfile.LIMITS,
     "version: v1\nnodes:\n  - {name: a, preset: t4}\n"),
]  # fmt: skip
VALID = {
    "agent-config": "version: v1\nnode: {name: n1, pool: p}\npools:\n  p: {mig_layout: all-1g}\n",
    "mig-layouts": "version: v1\nmig-configs:\n  a:\n"
    "    - devices: all\n      mig-enabled: false\n",
    "mig-hooks": "version: v1\nhooks: {}\n",
    "tier-policy": "version: v1\ntiers:\n  - name: training\n",
    "quota-policy": "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n"
    "      t: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n",
    "cluster-file": "version: v1\nnodes:\n  - {name: a, preset: t4, labels: {team: ml}}\n",
}


def _bomb(rng: random.Random, head: str) -> tuple[str, int]:
    """An alias bomb and the number of values its last alias expands to."""
    fan, height = rng.randint(2, 12), rng.randint(3, 10)
    flow = rng.random() < 0.5
    lines = [head.rstrip("\n"), f"b0: &b0 [{', '.join(['x'] * fan)}]"]
    for level in range(1, height):
        if flow:
            lines.append(f"b{level}: &b{level} [{', '.join([f'*b{level - 1}'] * fan)}]")
        else:
            lines.append(f"b{level}: &b{level}")
            lines += [f"  - *b{level - 1}"] * fan
    key = rng.choice(["nodes", "teams", "tiers", "pools", "mig-configs", "x"])
    lines.append(f"{key}: *b{height - 1}")
    return "\n".join(lines) + "\n", fan**height


def _deep(rng: random.Random, head: str) -> str:
    depth = rng.randint(yamlfile.MAX_DEPTH + 1, 6000)
    if rng.random() < 0.5:
        return head + "x: " + "[" * depth + "]" * depth + "\n"
    if rng.random() < 0.5:
        return head + "x: " + "{a: " * depth + "1" + "}" * depth + "\n"
    # block style, as an editor would indent it (kept shallower: a line per level)
    depth = min(depth, 400)
    return head + "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)) + "  " * depth + "v: 1\n"


def _not_utf8(rng: random.Random, valid: str) -> tuple[bytes, int]:
    data = valid.encode()
    where = rng.randrange(len(data) + 1)
    bad = rng.choice([b"\xff", b"\xfe", b"\xc3\x28", b"\xe9", b"\x80", b"\xed\xa0\x80"])
    return data[:where] + bad + data[where:], data.count(b"\n", 0, where) + 1


def test_yaml_limits(tmp_path: Path, tally: Tally) -> None:
    rng = random.Random(32)
    for case in range(size(60, 3000)):
        name, read, limits, head = READERS[case % len(READERS)]
        kind = rng.choice(["bomb", "deep", "not-utf8", "size"])
        path = tmp_path / f"{name}-{case}.yaml"
        expect: str | None
        may_pass = False
        if kind == "bomb":
            text, values = _bomb(rng, head)
            path.write_text(text)
            expect = "(the alias limit"
            may_pass = values <= limits.max_alias_values
        elif kind == "deep":
            path.write_text(_deep(rng, head))
            expect = f"nested deeper than {limits.max_depth} levels (the depth limit)"
        elif kind == "not-utf8":
            content, line = _not_utf8(rng, VALID[name])
            path.write_bytes(content)
            expect = f"{path}:{line}: byte 0x"
        else:
            if limits.max_bytes > yamlfile.MAX_BYTES and rng.random() < 0.9:
                kind = "not-utf8"  # a 64 MiB file per case would be the campaign's whole time
                content, line = _not_utf8(rng, VALID[name])
                path.write_bytes(content)
                expect = f"{path}:{line}: byte 0x"
            else:
                with path.open("wb") as fh:
                    fh.write(head.encode())
                    fh.write(b"# padding\n" * (limits.max_bytes // 10 + 1))
                expect = f"{path}: larger than {limits.max_bytes // 1024} KiB (the size limit)"
        label = f"{name} {kind} #{case}"
        started = time.monotonic()
        try:
            error = read(path)
        except Exception as exc:  # noqa: BLE001 - counting what escapes is the point
            tally.lose(f"{label}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        elapsed = time.monotonic() - started
        if elapsed > SECONDS:
            tally.lose(f"{label}: took {elapsed:.1f} s")
        elif error is None:
            if may_pass:
                tally.ok()
            else:
                tally.lose(f"{label}: read without an error")
        elif not all(line.startswith(str(path)) for line in error.splitlines()) or (
            "\n" in error and not may_pass
        ):
            # One line; a small bomb read as data may list each problem it holds, one a line.
            tally.lose(f"{label}: not one line naming the file: {error[:300]!r}")
        elif expect in error or may_pass:
            tally.ok()
        else:
            tally.lose(f"{label}: {error[:300]!r} does not say {expect!r}")
        path.unlink()
    tally.verify()


# --- name rules ---------------------------------------------------------------------------------

_ALNUM = set(string.ascii_letters + string.digits)
_LOWER_ALNUM = set(string.ascii_lowercase + string.digits)


def _is_dns_label(text: str, limit: int = 63) -> bool:
    """RFC 1123 label, read character by character (no regular expression)."""
    return (
        0 < len(text) <= limit
        and all(c in _LOWER_ALNUM or c == "-" for c in text)
        and text[0] in _LOWER_ALNUM
        and text[-1] in _LOWER_ALNUM
    )


def _is_dns_subdomain(text: str, limit: int = 253) -> bool:
    # Kubernetes' IsDNS1123Subdomain bounds the whole name only, not each dotted part.
    return 0 < len(text) <= limit and all(_is_dns_label(p, limit) for p in text.split("."))


def _is_qualified_name_part(text: str) -> bool:
    return (
        0 < len(text) <= 63
        and all(c in _ALNUM or c in "-_." for c in text)
        and text[0] in _ALNUM
        and text[-1] in _ALNUM
    )


def _is_label_key(text: str) -> bool:
    if text.count("/") > 1:
        return False
    if "/" in text:
        prefix, name = text.split("/")
        return _is_dns_subdomain(prefix) and _is_qualified_name_part(name)
    return _is_qualified_name_part(text)


def _is_label_value(text: str) -> bool:
    return text == "" or _is_qualified_name_part(text)


_SUFFIXES = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "", "k", "M", "G", "T", "P", "E"]


def _grammar_quantity(text: str) -> bool:
    """The API's quantity grammar, read by hand: sign, number, then one suffix or exponent."""
    i = 1 if text[:1] in ("+", "-") else 0
    start = i
    while i < len(text) and text[i] in string.digits:
        i += 1
    whole = i - start
    frac = 0
    if i < len(text) and text[i] == ".":
        i += 1
        f_start = i
        while i < len(text) and text[i] in string.digits:
            i += 1
        frac = i - f_start
    if whole == 0 and frac == 0:
        return False
    rest = text[i:]
    if rest in _SUFFIXES:
        return True
    if rest[:1] in ("e", "E"):
        exp = rest[1:]
        exp = exp[1:] if exp[:1] in ("+", "-") else exp
        return bool(exp) and all(c in string.digits for c in exp)
    return False


def _near_miss(rng: random.Random, valid: str) -> str:
    """A valid name with a few edits: what a typo or a template bug produces."""
    text = list(valid)
    for _ in range(rng.randint(0, 3)):
        op = rng.randrange(4)
        where = rng.randrange(len(text) + 1)
        char = rng.choice("aZ9-_./ !:@\t\né\u0661" + string.ascii_letters)
        if op == 0:
            text.insert(where, char)
        elif op == 1 and text:
            text.pop(min(where, len(text) - 1))
        elif op == 2 and text:
            text[min(where, len(text) - 1)] = char
        else:
            text = text * rng.randint(1, 5)  # too long
    return "".join(text)


SEEDS = {
    "label-key": ["nodeagent.io/tier", "team", "nvidia.com/gpu.product", "a.b-c_d", "x/y"],
    "label-value": ["training", "NVIDIA-H100-80GB-HBM3", "", "a", "1.2_3-x"],
    "dns-label": ["ml", "team-a", "a1", "x"],
    "dns-subdomain": ["gpu-a", "node-1.rack-2.dc", "a.b", "x"],
    "quantity": ["2", "500m", "1.5Gi", "2k", "1e3", ".5", "5.", "-1", "+7E", "1e-3", "0.1n"],
}
CHECKS: dict[str, tuple[Callable[[str], object], Callable[[str], bool]]] = {
    "label-key": (label_key, _is_label_key),
    "label-value": (any_label_value, _is_label_value),
    "dns-label": (lambda t: dns_label(t, "name"), _is_dns_label),
    "dns-subdomain": (lambda t: dns_subdomain(t, 253, "name"), _is_dns_subdomain),
}


def _quantity_case(tally: Tally, text: str) -> None:
    try:
        got: Fraction | None = parse_quantity(text)
        why = ""
    except QuantityError as exc:
        got, why = None, str(exc)
    except Exception as exc:  # noqa: BLE001
        tally.lose(f"quantity {text!r}: {type(exc).__name__}: {exc}")
        return
    if not _grammar_quantity(text):
        ok = got is None and "\n" not in why
    else:
        exact = Fraction(Decimal(client_parse_quantity(text)))
        if abs(exact) > MAX:
            ok = got is None and "larger than Kubernetes holds" in why
        elif (exact * 10**9).denominator == 1:
            ok = got == exact
        else:  # below a nano-unit: rounded up, away from zero
            ok = got is not None and 0 < abs(got) - abs(exact) < Fraction(1, 10**9)
    if ok:
        tally.ok()
    else:
        tally.lose(f"quantity {text!r}: got {got} {why!r}")


def _in_a_cluster_file(tally: Tally, family: str, text: str, accepted: bool) -> None:
    """The name in a cluster file: read when valid, else one line naming its field."""
    if family not in ("label-key", "label-value", "quantity") or "\n" in text or "\t" in text:
        return
    quoted = "'" + text.replace("'", "''") + "'"
    if family == "quantity":
        doc = (
            "version: v1\nnodes: [{name: a, preset: t4}]\npods:\n  - apiVersion: v1\n"
            "    kind: Pod\n    metadata: {name: p}\n    spec:\n      containers:\n"
            f"        - {{name: m, image: i, resources: {{requests: {{cpu: {quoted}}}}}}}\n"
        )
        # cpu is no device count: any quantity the API accepts, if not negative
        accepted = accepted and Fraction(Decimal(client_parse_quantity(text))) >= 0
        field = "requests.cpu"
    else:
        labels = f"{{{quoted}: x}}" if family == "label-key" else f"{{team: {quoted}}}"
        doc = f"version: v1\nnodes: [{{name: a, preset: t4, labels: {labels}}}]\n"
        field = "nodes.0.labels"
    try:
        parse_cluster(doc, "cluster.yaml")
        read = True
        why = ""
    except ClusterFileError as exc:
        read, why = False, str(exc)
    except Exception as exc:  # noqa: BLE001
        tally.lose(f"{family} {text!r} in a cluster file: {type(exc).__name__}: {exc}")
        return
    if read == accepted and (read or (field in why and "\n" not in why)):
        tally.ok()
    else:
        tally.lose(f"{family} {text!r} in a cluster file: read={read} {why!r}")


def test_name_rules(tally: Tally) -> None:
    rng = random.Random(1123)
    families = sorted(SEEDS)
    for case in range(size(2000, 200_000)):
        family = families[case % len(families)]
        text = _near_miss(rng, rng.choice(SEEDS[family]))
        if family == "quantity":
            _quantity_case(tally, text)
            accepted = (
                _grammar_quantity(text)
                and abs(Fraction(Decimal(client_parse_quantity(text)))) <= MAX
            )
        else:
            check, oracle = CHECKS[family]
            accepted = oracle(text)
            try:
                check(text)
                got = True
                why = ""
            except ValueError as exc:
                got, why = False, str(exc)
            except Exception as exc:  # noqa: BLE001
                tally.lose(f"{family} {text!r}: {type(exc).__name__}: {exc}")
                continue
            if got == accepted and (got or ("\n" not in why and repr(text) in why)):
                tally.ok()
            else:
                tally.lose(f"{family} {text!r}: validator {got}, rules {accepted}: {why!r}")
        if rng.random() < 0.1:
            _in_a_cluster_file(tally, family, text, accepted)
    tally.verify()
