"""Tiers and drains: the pure planner, the controller that carries out its plan, single-GPU
remediation, leader election and the circuit breaker."""
