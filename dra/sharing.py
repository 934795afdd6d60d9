"""Sharing per claim: time-slicing or MPS, from the opaque parameters of a claim or its class.

The shape is NVIDIA's (``GpuConfig`` / ``MigDeviceConfig`` with ``sharing.strategy``
``TimeSlicing`` or ``MPS``), under API group ``resource.nodeagent.io/v1beta1``; NVIDIA's group
``resource.nvidia.com/v1beta1`` is read the same, so claims written for NVIDIA's driver keep
working. Configs apply in the allocation's order (class configs first, then the claim's), a
later one winning for the requests it names (none named: every request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent.config.quantity import QuantityError, parse_quantity
from nodeagent_dra.claim import DeviceConfig, json_type

API_GROUPS = ("resource.nodeagent.io/v1beta1", "resource.nvidia.com/v1beta1")
KINDS = ("GpuConfig", "MigDeviceConfig")
STRATEGIES = ("TimeSlicing", "MPS")
INTERVALS = ("Default", "Short", "Medium", "Long")


class SharingError(ValueError):
    """Opaque parameters this driver cannot honour (the claim's error says which)."""


@dataclass(frozen=True, slots=True)
class Share:
    """How the containers of one claim share a device."""

    strategy: str  # TimeSlicing or MPS
    interval: str = "Default"
    active_thread_percentage: int | None = None
    pinned_memory_limit_mib: int | None = None

    @property
    def mps(self) -> bool:
        """Whether the device is shared through MPS."""
        return self.strategy == "MPS"

    @property
    def env(self) -> tuple[str, ...]:
        """What the containers are told of the sharing."""
        return (f"NODEAGENT_SHARING={self.strategy}",)


def _mib(text: Any) -> int:
    """A memory quantity (Kubernetes' grammar, as NVIDIA's driver reads it) in whole MiB."""
    try:
        amount = parse_quantity(text)
    except QuantityError as exc:
        raise SharingError(f"defaultPinnedDeviceMemoryLimit: {exc}") from exc
    if amount <= 0:
        raise SharingError(f"defaultPinnedDeviceMemoryLimit {text!r} must be more than 0")
    return max(1, int(amount / 2**20))


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SharingError(f"{what} must be an object, not {json_type(value)}")
    return value


def _object_or_none(value: Any, what: str) -> Mapping[str, Any]:
    """An optional object: absent or null is empty; an empty list or string is still wrong."""
    return {} if value is None else _object(value, what)


def parse(parameters: Any) -> Share | None:
    """The sharing of one opaque config; ``None`` when it asks for none."""
    parameters = _object(parameters, "opaque parameters")
    api, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api not in API_GROUPS:
        raise SharingError(f"opaque parameters apiVersion {api!r}; use {API_GROUPS[0]}")
    if kind not in KINDS:
        raise SharingError(f"opaque parameters kind {kind!r}; use one of {', '.join(KINDS)}")
    if parameters.get("sharing") is None:
        return None
    sharing = _object(parameters["sharing"], "sharing")
    strategy = sharing.get("strategy")
    if strategy not in STRATEGIES:
        raise SharingError(f"sharing strategy {strategy!r}; use TimeSlicing or MPS")
    if strategy == "TimeSlicing":
        slicing = _object_or_none(sharing.get("timeSlicingConfig"), "sharing.timeSlicingConfig")
        interval = slicing.get("interval", "Default")
        if interval not in INTERVALS:
            raise SharingError(
                f"timeSlicingConfig.interval {interval!r}; use {', '.join(INTERVALS)}"
            )
        return Share("TimeSlicing", interval=interval)
    mps = _object_or_none(sharing.get("mpsConfig"), "sharing.mpsConfig")
    pct = mps.get("defaultActiveThreadPercentage")
    if pct is not None and not (type(pct) is int and 1 <= pct <= 100):
        raise SharingError(f"mpsConfig.defaultActiveThreadPercentage {pct!r} must be 1..100")
    limit = mps.get("defaultPinnedDeviceMemoryLimit")
    return Share("MPS", active_thread_percentage=pct,
                 pinned_memory_limit_mib=None if limit is None else _mib(limit))  # fmt: skip


def sharing_for(configs: Sequence[DeviceConfig], driver: str) -> dict[str, Share]:
    """Request name -> its sharing, from ``status.allocation.devices.config`` (in allocation
    order); ``"*"`` is the sharing of requests no config names.

    Raises:
        SharingError: naming the config entry whose parameters this driver cannot honour.
    """
    out: dict[str, Share] = {}
    for n, entry in enumerate(configs):
        if entry.opaque is None or entry.opaque.driver != driver:
            continue
        try:
            share = parse(entry.opaque.parameters)
        except SharingError as exc:
            raise SharingError(f"status.allocation.devices.config[{n}]: {exc}") from None
        if share is None:
            continue
        for request in entry.requests or ["*"]:
            out[request] = share
    return out
