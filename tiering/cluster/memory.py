"""Pausing Python's cyclic garbage collector around work that makes millions of objects."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the review reads and builds, or a diagnosis
    pass runs over a cluster's view.

    Decoded API lists are trees of dicts and lists without cycles, freed by reference counting
    alone; but each of the collector's full passes walks every live object, and reading
    100,000 Workloads and pods creates millions of them: with the collector on, decoding takes
    four to six times as long (docs/benchmarks.md). It is on again on the way out.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
