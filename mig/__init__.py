"""MIG partitioning: mig-parted v1 layouts, an exact fragmentation-aware planner, a crash-safe
applier.

Layering: :mod:`nodeagent_mig.planner` is pure (geometry in, plan out);
:mod:`nodeagent_mig.config` parses and validates layout files; :mod:`nodeagent_mig.apply` is the
only module here that changes GPUs, and it does so through the GPU layer's
:class:`~nodeagent.gpu.protocols.MigDevices` only.
"""
