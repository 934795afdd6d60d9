"""The central tiering service: a floor and four areas (docs/architecture.md, "The pool half").

- ``cluster``: the floor every area reads the cluster with (API vocabulary, informers, clock,
  tier policy, the parsed Node, Pod and Workload models, quantities and timestamps);
- ``drain``: node tiers from capabilities and health, safe drains of unstable nodes within a
  disruption budget, single-GPU remediation, leader election and the circuit breaker;
- ``pending``: why each pending GPU workload waits and the smallest change that unblocks it,
  with its loop, its Events on pods and its rolling history;
- ``quota``: team quotas on Kueue, the tiers as ResourceFlavors, and what healthy capacity
  backs them;
- ``review``: the pool review the ``report`` command prints;
- ``service`` and ``simulate`` compose them (one replica; one pass over a cluster file).

See ``docs/tiering.md``.
"""
