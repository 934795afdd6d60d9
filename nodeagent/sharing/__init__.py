"""The pool's sharing policy in action: what the agent does about a shared GPU that stays noisy.

:mod:`~nodeagent.sharing.actions` is the policy loop; :func:`~nodeagent.sharing.component.build`
is what the composition layer calls, and returns a component that does nothing when the pool
turns the actions off.
"""
