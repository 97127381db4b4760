"""`metasrv demo`: the WAL purge end to end on the local stack with simulated datanodes.

- `_run.py`: `run_demo`, the phases one after the other, the summary and the exit status.
- `_phases.py`: the phases, in order (`PHASES`).
- `_context.py`: `DemoRun`, what the phases share (the archiver child too), and the clean-up.
- `_config.py`: `DemoOptions`, the services' addresses and the metasrv and archiver configs
  the demo writes (the WAL archive enabled, on the stack's S3 server).
- `_report.py`: what the demo watches and prints (the live topic table, the summary).
"""

from toolbox.demo._config import DemoOptions, DemoServices, archiver_config, demo_config
from toolbox.demo._phases import PHASES, TrimTarget, choose_trim
from toolbox.demo._run import run_demo

__all__ = [
    "PHASES",
    "DemoOptions",
    "DemoServices",
    "TrimTarget",
    "archiver_config",
    "choose_trim",
    "demo_config",
    "run_demo",
]
