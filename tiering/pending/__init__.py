"""Why pending GPU workloads wait: the pure diagnosis (results, per-node capacity and
constraints, fits, MIG gains, the pass), its loop in the service, its Events on pods and its
rolling history."""
