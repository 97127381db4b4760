"""`metasrv demo`: the WAL purge end to end on the local stack with simulated datanodes.

- `_run.py`: `run_demo`, the phases one after the other, the summary and the exit status.
- `_phases.py`: the phases, in order (`PHASES`).
- `_context.py`: `DemoRun`, what the phases share, and the clean-up at the end.
- `_config.py`: `DemoOptions`, the services' addresses and the metasrv config the demo writes.
- `_report.py`: what the demo watches and prints (the live topic table, the summary).
"""

from toolbox.demo._config import DemoOptions, demo_config
from toolbox.demo._phases import PHASES
from toolbox.demo._run import run_demo

__all__ = ["PHASES", "DemoOptions", "demo_config", "run_demo"]
