"""`metasrv demo`: the WAL purge end to end on the local stack with simulated datanodes."""

from toolbox.demo._run import PHASES, DemoOptions, demo_config, run_demo

__all__ = ["PHASES", "DemoOptions", "demo_config", "run_demo"]
