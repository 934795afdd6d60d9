"""A ResourceClaim as the driver reads it: one validating model of the fields it uses.

The kubelet's request names a claim; the driver reads the rest (``metadata``,
``status.allocation.devices``) from the API server. Whatever that answer holds, it either
becomes a :class:`ResourceClaim` or one :class:`ClaimShapeError` that names the first field
that is wrong (``status.allocation.devices.results[1].device: missing``), so a malformed claim
fails alone and never takes its neighbours in the same call with it.

Fields the driver does not use are ignored; opaque parameters are checked only for this
driver (:mod:`nodeagent_dra.sharing`), since another driver's are not ours to judge.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nodeagent.config.errors import dotted


class ClaimShapeError(ValueError):
    """The claim is not shaped as the resource.k8s.io API defines it; the message names where."""


class _Shape(BaseModel):
    # strict: a number is not a string, a mapping is not a list. Built at first use, not import.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, defer_build=True)


class Metadata(_Shape):
    """The claim's identity."""

    name: str
    namespace: str
    uid: str = Field(min_length=1)


class DeviceResult(_Shape):
    """One allocated device (``status.allocation.devices.results[]``)."""

    request: str = Field(min_length=1)
    driver: str
    pool: str
    device: str = Field(min_length=1)


class OpaqueConfig(_Shape):
    """Opaque parameters for one driver; only that driver reads ``parameters``."""

    driver: str
    parameters: Any = None


class DeviceConfig(_Shape):
    """One entry of ``status.allocation.devices.config[]``, in allocation order."""

    requests: list[str] = []
    opaque: OpaqueConfig | None = None


class DeviceAllocation(_Shape):
    """``status.allocation.devices``."""

    results: list[DeviceResult] = []
    config: list[DeviceConfig] = []


class Allocation(_Shape):
    """``status.allocation``."""

    devices: DeviceAllocation = DeviceAllocation()


class Status(_Shape):
    """``status``; no allocation: the scheduler has not allocated the claim."""

    allocation: Allocation | None = None


class ResourceClaim(_Shape):
    """The fields of a ResourceClaim the driver prepares from."""

    metadata: Metadata
    status: Status | None = None

    @property
    def allocation(self) -> Allocation | None:
        """The allocation, or None when the claim is not allocated."""
        return self.status.allocation if self.status is not None else None


_JSON_TYPES = {
    type(None): "null",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    list: "a list",
    dict: "an object",
}
_WANTED = {
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dict_type": "an object",
    "list_type": "a list",
    "string_type": "a string",
}


def json_type(value: Any) -> str:
    """What ``value`` is in JSON's words: "null", "a string", "an object"..."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _problem(error: Any) -> str:
    kind = error["type"]
    got = json_type(error.get("input"))
    if kind == "missing":
        what = "missing"
    elif kind in _WANTED:
        what = f"must be {_WANTED[kind]}, not {got}"
    elif kind == "string_too_short":
        what = "must not be empty"
    else:
        what = str(error["msg"])
    return f"{dotted(error['loc']) or 'the answer'}: {what}"


def parse_claim(raw: Any) -> ResourceClaim:
    """``raw`` (the API's JSON answer) as a claim.

    Raises:
        ClaimShapeError: naming the first field that is wrong (and how many more there are).
    """
    try:
        return ResourceClaim.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ClaimShapeError(_problem(errors[0]) + more) from None
