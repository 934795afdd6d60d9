"""The review's tests read a cluster with Kueue as the quota tests build it: the same fixture."""

from tests.tiering.quota.conftest import env

__all__ = ["env"]
