"""MIG partitioning: mig-parted v1 layouts, an exact fragmentation-aware planner, a crash-safe
applier.

Layering: :mod:`mig.planner` is pure (geometry in, plan out); :mod:`mig.config` parses and
validates layout files; :mod:`mig.apply` is the only module here that changes GPUs, and it does so
through :class:`nodeagent.gpu.node.GpuNode` only.
"""
