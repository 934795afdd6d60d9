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
    if not _LABEL_VALUE.match(text):
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
    if len(name) > limit or not DNS_SUBDOMAIN.match(name):
        raise ValueError(
            f"{name!r} is not a valid {what} (lower-case letters, digits, '-' and '.', starting "
            f"and ending with a letter or digit, at most {limit} characters)"
        )
    return name
