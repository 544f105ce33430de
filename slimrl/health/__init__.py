"""Is RL working? Run-health checks over what TRL's GRPO/RLOO log (:mod:`slimrl.health.checks`) and the callback
every patched GRPO/RLOO trainer gets (:mod:`slimrl.health.monitor`)."""

from slimrl.health.checks import CHECKS, Thresholds
from slimrl.health.monitor import HealthCallback, RunHealthWarning, attach_health, monitor_of

__all__ = ["CHECKS", "Thresholds", "HealthCallback", "RunHealthWarning", "attach_health", "monitor_of"]
