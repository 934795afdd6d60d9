"""The floor of the tiering service: what every area reads the cluster with.

The Kubernetes and Kueue API vocabulary (:mod:`.api`, :mod:`.kueue`), the informers, the clock,
the tier policy, the parsed Node, Pod and Workload models (:mod:`.nodes`, :mod:`.view`), the
one quantity and timestamp module (:mod:`.units`) and the cluster file. Nothing here imports
an area (drain, pending, quota, review).
"""

from typing import Any

JSON = dict[str, Any]  # a Kubernetes object as the API server returns it, decoded
