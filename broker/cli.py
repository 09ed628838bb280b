"""`tierbroker`: the command line.

`tierbroker serve [--config FILE] [--override key=value ...]` runs a broker until
SIGINT or SIGTERM, then shuts it down cleanly.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from broker.config import ConfigError, load_config

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
    asyncio.run(_serve(broker_config))


async def _serve(config: object) -> None:
    from broker.broker_server import BrokerServer

    server = BrokerServer(config)  # type: ignore[arg-type]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        await stop.wait()
    finally:
        await server.stop()


def main() -> None:
    app()
