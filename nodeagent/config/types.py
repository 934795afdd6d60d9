"""Value types more than one file format shares."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

# Kubernetes label values: at most 63 letters, digits, '-', '_' or '.', alphanumeric at both
# ends (empty is allowed by Kubernetes, but never meant in a name).
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def label_value(text: str) -> str:
    """``text`` when it is a valid, non-empty label value; else a ValueError that says why."""
    if not _LABEL_VALUE.fullmatch(text):
        raise ValueError(
            f"{text!r} must be a valid label value (at most 63 letters, digits, '-', '_' or "
            "'.', starting and ending with a letter or digit)"
        )
    return text


# A name that ends up as a label value (pool names, tier names).
LabelValue = Annotated[str, AfterValidator(label_value)]


# A DNS subdomain (RFC 1123): lower-case alphanumerics, '-' and '.', alphanumeric at both ends
# of every label. Node names (at most 253 characters) and DRA driver names (63) are such names.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def dns_subdomain(name: str, limit: int, what: str) -> str:
    """``name`` when it is a DNS subdomain of at most ``limit`` characters, else a ValueError
    naming ``what`` it was meant to be."""
    if len(name) > limit or not DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a valid {what} (lower-case letters, digits, '-' and '.', starting "
            f"and ending with a letter or digit, at most {limit} characters)"
        )
    return name


def kube_node_name(name: str) -> str:
    """``name`` when Kubernetes would take it as a node's name (a DNS subdomain)."""
    return dns_subdomain(name, 253, "Kubernetes node name")


# --- Kubernetes' name rules (k8s.io/apimachinery/pkg/util/validation), for every name nodeagent
# reads from a file and later writes to, or matches against, an API object ---------------------

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ANY_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_key(key: str) -> str:
    """``key`` when it is a valid label (or annotation, taint, selector) key; else a ValueError.

    A key is an optional prefix, a DNS subdomain of at most 253 characters, and ``/``, then a
    name of at most 63 letters, digits, ``-``, ``_`` or ``.`` with a letter or digit at both
    ends: ``nodeagent.io/tier``, ``team``.
    """
    prefix, _, name = key.rpartition("/")
    if "/" in key and (
        not prefix or len(prefix) > 253 or "/" in prefix or not DNS_SUBDOMAIN.fullmatch(prefix)
    ):
        raise ValueError(
            f"{key!r} is not a valid label key: the prefix before '/' must be a DNS subdomain "
            "(lower-case letters, digits, '-' and '.', at most 253 characters)"
        )
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        raise ValueError(
            f"{key!r} is not a valid label key: the name must be 1-63 letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit (an optional 'prefix/' before)"
        )
    return key


def any_label_value(text: str) -> str:
    """``text`` when it is a valid label value, empty included (as Kubernetes allows in a
    selector or on a node); else a ValueError."""
    if len(text) > 63 or not _ANY_LABEL_VALUE.fullmatch(text):
        raise ValueError(
            f"{text!r} is not a valid label value (at most 63 letters, digits, '-', '_' or "
            "'.', starting and ending with a letter or digit, or empty)"
        )
    return text


def labels(values: dict[str, str]) -> dict[str, str]:
    """A label map whose every key and value Kubernetes accepts; else a ValueError naming the
    first bad one."""
    for key, value in values.items():
        label_key(key)
        any_label_value(value)
    return values


def dns_label(name: str, what: str) -> str:
    """``name`` when it is a DNS label (RFC 1123: at most 63 lower-case letters, digits and
    '-', alphanumeric at both ends), as namespaces and many object names must be; else a
    ValueError naming ``what`` it was meant to be."""
    if len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a valid {what} (a DNS label: at most 63 lower-case letters, "
            "digits and '-', starting and ending with a letter or digit)"
        )
    return name


LabelKey = Annotated[str, AfterValidator(label_key)]
AnyLabelValue = Annotated[str, AfterValidator(any_label_value)]
Labels = Annotated[dict[str, str], AfterValidator(labels)]
