"""`tierbroker`: the command line.

`tierbroker serve [--config FILE] [--override key=value ...]` runs a broker until
SIGINT or SIGTERM, then shuts it down cleanly; `tierbroker export` writes a topic's
remote tier to Parquet straight from the object store (`pipeline.jobs.export`). The
commands that work with a running broker (`topic`, `produce`, `consume`, `group`,
`cluster`, `tier status`) live in `broker.commands` and load the client library only
when they run, so `serve` starts without it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from tierbroker.broker.commands import clients, cluster, groups, tier, topics
from tierbroker.broker.config import BrokerConfig, ConfigError, load_config
from tierbroker.broker.memory import reuse_large_buffers

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="A Kafka-protocol broker with tiered storage."
)


@app.callback()
def _main() -> None:
    """tierbroker: serve a broker, or work with one."""


@app.command()
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="server.properties file")
    ] = None,
    override: Annotated[
        list[str] | None, typer.Option("--override", help="key=value, repeatable")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
    brokers: Annotated[
        int, typer.Option(min=1, help="brokers to run in this process (ports from listeners up)")
    ] = 1,
    racks: Annotated[str | None, typer.Option(help="racks of the brokers, in turn: a,b,c")] = None,
) -> None:
    """Run a broker until SIGINT or SIGTERM."""
    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
    )
    try:
        broker_config = load_config(config, override or [])
    except (ConfigError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    reuse_large_buffers()
    rack_list = [r.strip() for r in racks.split(",") if r.strip()] if racks else []
    fatal_error = asyncio.run(_serve(broker_config, brokers, rack_list))
    if fatal_error is not None:
        typer.echo(f"error: {fatal_error}", err=True)
        raise typer.Exit(1)


async def _serve(config: BrokerConfig, brokers: int, racks: list[str]) -> str | None:
    """Serve until a signal (None), or until a broker must stop (what failed)."""
    from tierbroker.broker.broker_server import (  # `tier status` needs none
        LogDirsOffline,
        StartupError,
    )
    from tierbroker.broker.cluster.store import ConnectionLossError
    from tierbroker.broker.cluster_runner import ClusterRunner

    runner = ClusterRunner(config, brokers, racks)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runner.stop_requested.set)
    try:
        await runner.start()
        await runner.stop_requested.wait()
    except (LogDirsOffline, StartupError) as e:
        return str(e)
    except ConnectionLossError as e:
        return f"cannot reach the metadata store ({e}): check zookeeper.connect"
    finally:
        await runner.stop()
    return runner.fatal_error


app.add_typer(topics.app, name="topic")
app.command()(clients.produce)
app.command()(clients.consume)
app.add_typer(groups.app, name="group")
app.add_typer(cluster.app, name="cluster")
app.add_typer(tier.app, name="tier")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def export(ctx: typer.Context) -> None:
    """Export a topic's remote tier to Parquet with Spark (`tierbroker export --help`)."""
    from tierbroker.pipeline.jobs.export import main as export_main

    raise typer.Exit(export_main(ctx.args))


def main() -> None:
    app()
