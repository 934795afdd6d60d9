"""What a component of the agent is: a supervised long-running part, optionally reloadable."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nodeagent.config.schema import AgentConfig


class Component(Protocol):
    """A long-running part of the agent, run on its own supervised thread.

    ``run`` blocks until ``stop`` is set and returns; raising means it crashed, and the
    supervisor restarts it with backoff. ``ready`` turns true once it serves (for READY=1 and
    ``/readyz``).
    """

    name: str

    def run(self, stop: threading.Event) -> None:
        """Do the component's work until ``stop`` is set."""
        ...

    @property
    def ready(self) -> bool:
        """Whether the component is up (serving, registered, sampled once)."""
        ...


@dataclass(slots=True)
class Idle:
    """A feature turned off: a component with nothing to do, so its caller never checks for
    ``None``. The composition layer leaves it out of the supervised set, so a disabled feature
    costs no thread and shows in no component list."""

    name: str

    @property
    def ready(self) -> bool:
        """Always: there is nothing to wait for."""
        return True

    def run(self, stop: threading.Event) -> None:
        """Return only at ``stop``: a component that ends on its own has crashed."""
        stop.wait()


@runtime_checkable
class Reloadable(Protocol):
    """Something that takes a new config without a restart (SIGHUP)."""

    def reload(self, config: AgentConfig) -> None:
        """Adopt ``config``; called from the main thread."""
        ...


@runtime_checkable
class Preparable(Protocol):
    """A component that claims something exclusive (a listening port) before any component runs.

    The agent calls ``prepare`` for every such component before starting the first one, so a
    taken port ends the start in one line instead of a component restart loop; ``unprepare``
    gives back what ``prepare`` took when the start is abandoned.
    """

    def prepare(self) -> None:
        """Claim the resource. Raises OSError when it is taken."""
        ...

    def unprepare(self) -> None:
        """Give back what :meth:`prepare` claimed, if anything (safe to call twice)."""
        ...
