"""Memory and time model of a training run, before any weight loads (``slimrl plan``)."""

from slimrl.planning.plan import Plan, Settings, Workload, plan

__all__ = ["Plan", "Settings", "Workload", "plan"]
