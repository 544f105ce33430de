"""Environments an agent trains against, served beside the run (:mod:`slimrl.environments.openenv`)."""

from slimrl.environments.openenv import is_port_open, launch_openenv

__all__ = ["is_port_open", "launch_openenv"]
