"""`metasrv demo`: registers the command; the demo itself lives in `toolbox.demo`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `metasrv demo` to the root app."""

    @app.command("demo")
    def demo(
        keep_running: Annotated[
            bool,
            typer.Option("--keep-running", help="Leave metasrv up afterwards (Ctrl-C stops it)."),
        ] = False,
        nodes: Annotated[int, typer.Option(min=1, help="Simulated datanodes.")] = 3,
        regions_per_node: Annotated[int, typer.Option(min=1, help="Regions per datanode.")] = 8,
        write_rate: Annotated[
            float, typer.Option(min=1.0, help="Rows per second in total.")
        ] = 200.0,
        phase_seconds: Annotated[
            float, typer.Option(min=5.0, help="Seconds per writing phase.")
        ] = 30.0,
        seed: Annotated[int, typer.Option(help="Workload seed.")] = 7,
        run_dir: Annotated[
            Path | None, typer.Option(help="Directory for config, logs, datanode data.")
        ] = None,
        cluster: Annotated[
            bool,
            typer.Option(
                "--cluster",
                help="Run on 3 Kafka brokers (RF 3, min ISR 2) and 3 etcd members, and kill "
                "a partition leader while purging.",
            ),
        ] = False,
    ) -> None:
        """Run the WAL purge end to end on local Kafka/etcd/PostgreSQL/S3 with simulated
        datanodes, one WAL archiver, and a region restored from the archive."""
        from rich.console import Console

        from toolbox.demo import DemoOptions, run_demo

        options = DemoOptions(
            nodes=nodes,
            regions_per_node=regions_per_node,
            write_rate=write_rate,
            phase_seconds=phase_seconds,
            seed=seed,
            keep_running=keep_running,
            run_dir=run_dir,
            cluster=cluster,
        )
        # Piped output gets room for the tables (rich assumes 80 columns off a terminal).
        console = Console(width=None if sys.stdout.isatty() else 120)
        raise typer.Exit(run_demo(options, console))
