"""What the device plugin serves, as other features may read it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class PublishedDevices(Protocol):
    """The devices the agent advertises to the kubelet now (the device plugin implements it)."""

    def advertised(self) -> Mapping[str, Mapping[str, bool]] | None:
        """Resource name -> {device ID: healthy}, replica IDs counted as the kubelet counts them.

        Empty until the plugin serves and after it stops; None when the agent runs no plugin.
        """
        ...
