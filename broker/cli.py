"""`tierbroker`: the command line.

`tierbroker serve [--config FILE] [--override key=value ...]` runs a broker until
SIGINT or SIGTERM, then shuts it down cleanly; `tierbroker tier status` shows both
tiers per partition; `tierbroker export` writes a topic's remote tier to Parquet
straight from the object store (`pipeline.jobs.export`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from broker.config import BrokerConfig, ConfigError, load_config
from broker.memory import reuse_large_buffers

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
    reuse_large_buffers()
    fatal_error = asyncio.run(_serve(broker_config))
    if fatal_error is not None:
        typer.echo(f"error: {fatal_error}", err=True)
        raise typer.Exit(1)


async def _serve(config: BrokerConfig) -> str | None:
    """Serve until a signal (None) or until no log dir is left online (what failed)."""
    from broker.broker_server import BrokerServer, LogDirsOffline  # `tier status` needs none

    server = BrokerServer(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.stop_requested.set)
    try:
        await server.start()
        await server.stop_requested.wait()
    except LogDirsOffline as e:
        return str(e)
    finally:
        await server.stop()
    return server.fatal_error


tier = typer.Typer(no_args_is_help=True, help="The remote tier of a running broker.")
app.add_typer(tier, name="tier")

STATUS_COLUMNS = (
    ("topic", "topic"),
    ("partition", "part"),
    ("log_start_offset", "log start"),
    ("local_log_start_offset", "local start"),
    ("log_end_offset", "log end"),
    ("remote_log_start_offset", "remote start"),
    ("remote_log_end_offset", "remote end"),
    ("local_segments", "local segs"),
    ("local_bytes", "local bytes"),
    ("remote_segments", "remote segs"),
    ("remote_bytes", "remote bytes"),
    ("copy_lag_segments", "lag segs"),
    ("copy_lag_bytes", "lag bytes"),
)


@tier.command("status")
def tier_status(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="the broker's properties")
    ] = None,
    override: Annotated[list[str] | None, typer.Option("--override", help="key=value")] = None,
    url: Annotated[
        str | None, typer.Option(help="metrics endpoint, e.g. http://127.0.0.1:9404")
    ] = None,
    topic: Annotated[str | None, typer.Option(help="only this topic")] = None,
) -> None:
    """Per partition: both tiers' offsets, bytes and segments, and the copy lag."""
    import json
    import shutil
    import urllib.request

    from rich.console import Console
    from rich.table import Table

    if url is None:
        try:
            broker_config = load_config(config, override or [])
        except (ConfigError, OSError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        if broker_config.metrics_port < 0:
            typer.echo("error: the broker has no metrics endpoint (metrics.port)", err=True)
            raise typer.Exit(2)
        host, _ = broker_config.advertised_listener
        url = f"http://{host}:{broker_config.metrics_port}"
    try:
        with urllib.request.urlopen(f"{url}/tier/status", timeout=10) as response:
            rows = json.load(response)
    except OSError as e:
        typer.echo(f"error: cannot reach {url}: {e}", err=True)
        raise typer.Exit(1) from None
    table = Table(title="tiered storage", header_style="bold")
    for _, title in STATUS_COLUMNS:
        table.add_column(title, justify="left" if title == "topic" else "right")
    for row in rows:
        if topic is None or row["topic"] == topic:
            table.add_row(*(_cell(row[key]) for key, _ in STATUS_COLUMNS))
    Console(width=max(shutil.get_terminal_size().columns, 160)).print(table)


def _cell(value: object) -> str:
    if isinstance(value, int) and value >= 1 << 20:
        return f"{value / (1 << 20):.1f} MiB"
    return str(value)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def export(ctx: typer.Context) -> None:
    """Export a topic's remote tier to Parquet with Spark (`tierbroker export --help`)."""
    from pipeline.jobs.export import main as export_main

    raise typer.Exit(export_main(ctx.args))


def main() -> None:
    app()
