"""`tierbroker`: the command line.

`tierbroker serve [--config FILE] [--override key=value ...]` runs a broker until
SIGINT or SIGTERM, then shuts it down cleanly; one that cannot within
`shutdown.timeout.ms` (the metadata store unreachable, say) shuts down uncontrolled,
logs flushed, and exits 1 with one line saying why. A start-up mistake (a bad property, a
port in use, a log dir it cannot write, ...) is found before anything is written and
reported in one `error:` line naming the property, with exit code 2; a failure after
the start (every log dir failed, an unexpected error) is one line with exit code 1.
`--debug` adds the traceback.

`tierbroker export` writes a topic's remote tier to Parquet straight from the object
store (`pipeline.jobs.export`). `tierbroker demo` runs a racked, tiered cluster in this
process and shows it at work (`broker.cli.demo`). The commands that work with a
running broker (`topic`, `produce`, `consume`, `group`, `cluster`, `tier status`, `txn`) live
in `broker.cli` and load the client library only when they run, so `serve` starts
without it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import traceback
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from tierbroker.broker.cli import (
    acls,
    clients,
    cluster,
    groups,
    partitions,
    remote,
    tier,
    topics,
    transactions,
    users,
)
from tierbroker.broker.cli import command_config as command_config_option
from tierbroker.broker.cli.common import command_group
from tierbroker.broker.network.request_log import REQUEST_LOGGER

if TYPE_CHECKING:
    from tierbroker.broker.config.broker_config import BrokerConfig
    from tierbroker.broker.server.preflight import BoundPorts

app = command_group("A Kafka-protocol broker with tiered storage.")


def _version(shown: bool) -> None:
    if shown:
        typer.echo(f"tierbroker {version('tierbroker')}")
        raise typer.Exit()


@app.callback()
def _main(
    _: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version"),
    ] = False,
    command_config: Annotated[
        Path | None,
        typer.Option(
            command_config_option.OPTION,
            envvar=command_config_option.ENV,
            help="client properties of a secured listener (security.protocol, "
            "sasl.jaas.config, ssl.truststore.location, ...), as Kafka's tools take them",
        ),
    ] = None,
) -> None:
    """tierbroker: serve a broker, or work with one."""
    command_config_option.load(command_config)


@app.command()
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="server.properties file")
    ] = None,
    override: Annotated[
        list[str] | None, typer.Option("--override", help="key=value, repeatable")
    ] = None,
    log_level: Annotated[
        list[str] | None,
        typer.Option(
            "--log-level",
            help="LEVEL for every logger (DEBUG, INFO, WARNING, ERROR), or LOGGER=LEVEL for "
            "one, e.g. tierbroker.request=DEBUG for the request log; repeatable",
        ),
    ] = None,
    ports_file: Annotated[
        Path | None,
        typer.Option(
            "--ports-file",
            help='write [{"broker_id", "host", "port", "metrics_port"}] here as JSON once '
            "listening (port 0 binds a free port)",
        ),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks of errors")] = False,
    brokers: Annotated[
        int, typer.Option(min=1, help="brokers to run in this process (ports from listeners up)")
    ] = 1,
    racks: Annotated[str | None, typer.Option(help="racks of the brokers, in turn: a,b,c")] = None,
) -> None:
    """Run a broker (or --brokers N) until SIGINT or SIGTERM.

    Without --config, the defaults serve on 127.0.0.1:9092 with data in
    /tmp/tierbroker-logs, tiering to its remote/ directory, and metrics on port 9404.
    """
    # The server's modules: the other commands need none of them.
    from tierbroker.broker.config.broker_config import ConfigError, load_config
    from tierbroker.broker.server.cluster_runner import broker_configs
    from tierbroker.broker.server.memory import reuse_large_buffers
    from tierbroker.broker.server.preflight import preflight
    from tierbroker.storage.long_lived import freeze_heap_in_this_process

    rack_list = [r.strip() for r in racks.split(",") if r.strip()] if racks else []
    try:
        _configure_logging(log_level or ["INFO"], tag_brokers=brokers > 1)
        broker_config = load_config(config, override or [])
        ports = preflight(broker_configs(broker_config, brokers, rack_list), ports_file)
    except ConfigError as e:
        _fail(str(e), 2, debug)
    except Exception as e:
        _fail(_unexpected(e), 1, debug)
    reuse_large_buffers()
    freeze_heap_in_this_process()
    try:
        fatal_error = asyncio.run(_serve(broker_config, brokers, rack_list, ports, ports_file))
    except ConfigError as e:  # a plugin that refused its settings
        _fail(str(e), 2, debug)
    except Exception as e:
        _fail(_unexpected(e), 1, debug)
    if fatal_error is not None:
        _fail(fatal_error, 1, debug)


def _configure_logging(levels: list[str], tag_brokers: bool) -> None:
    """Every logger at the last plain LEVEL; LOGGER=LEVEL for one logger. The request log
    (`tierbroker.request`) stays off unless named, as Kafka's request logger does.
    `tag_brokers`: lines name the broker that wrote them (several in this process)."""
    from tierbroker.broker.config.broker_config import ConfigError
    from tierbroker.broker.server.cluster_runner import RUNNING_BROKER

    named = {REQUEST_LOGGER: "INFO"}
    root = "INFO"
    for item in levels:
        name, sep, level = item.rpartition("=")
        level = level.strip().upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") or (sep and not name):
            raise ConfigError(
                f"--log-level {item!r}: use DEBUG, INFO, WARNING or ERROR, or LOGGER=LEVEL"
            )
        if sep:
            named[name.strip()] = level
        else:
            root = level
    logging.basicConfig(
        level=root,
        stream=sys.stderr,
        format="[%(asctime)s] %(levelname)s %(broker)s%(name)s: %(message)s",
    )

    def tag(record: logging.LogRecord) -> bool:
        broker = RUNNING_BROKER.get() if tag_brokers else None
        record.broker = "" if broker is None else f"[broker {broker}] "
        return True

    for handler in logging.getLogger().handlers:
        handler.addFilter(tag)
    for name, level in named.items():
        logging.getLogger(name).setLevel(level)


def _unexpected(e: Exception) -> str:
    return f"unexpected {type(e).__name__}: {e} (rerun with --debug for the traceback)"


def _fail(message: str, code: int, debug: bool) -> NoReturn:
    """One `error:` line on stderr (after the traceback, with --debug), and exit `code`."""
    if debug and sys.exc_info()[0] is not None:
        traceback.print_exc()
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


async def _serve(
    config: BrokerConfig,
    brokers: int,
    racks: list[str],
    ports: list[BoundPorts],
    ports_file: Path | None,
) -> str | None:
    """Serve until a signal (None), or until a broker must stop (what failed)."""
    from tierbroker.broker.metadata.store import ConnectionLossError
    from tierbroker.broker.network.endpoints import remove_ports_file, write_ports_file
    from tierbroker.broker.server.broker_server import LogDirsOffline, StartupError
    from tierbroker.broker.server.cluster_runner import ClusterRunner

    runner = ClusterRunner(config, brokers, racks, ports)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runner.stop_requested.set)
    try:
        await runner.start()
        if ports_file is not None:
            write_ports_file(ports_file, [b.endpoints for b in runner.brokers])
        await runner.stop_requested.wait()
    except (LogDirsOffline, StartupError) as e:
        return str(e)
    except ConnectionLossError as e:
        return f"cannot reach the metadata store ({e}): check zookeeper.connect"
    finally:
        if ports_file is not None:
            remove_ports_file(ports_file)
        await runner.stop()
    uncontrolled = (b.shutdown_error for b in runner.brokers if b.shutdown_error is not None)
    return runner.fatal_error or next(uncontrolled, None)


app.add_typer(topics.app, name="topic")
app.command()(clients.produce)
app.command()(clients.consume)
app.add_typer(groups.app, name="group")
app.add_typer(cluster.app, name="cluster")
app.add_typer(acls.app, name="acl")
app.add_typer(partitions.app, name="partition")
app.add_typer(tier.app, name="tier")
app.add_typer(transactions.app, name="txn")
app.add_typer(remote.app, name="remote")
app.add_typer(users.app, name="user")


@app.command()
def demo(
    mib: Annotated[float, typer.Option(help="MiB to produce (1 KiB records)")] = 16.0,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="keep the data and broker log here")
    ] = None,
) -> None:
    """Start 3 brokers in racks a, b, c with tiering in this process, show segments
    tiering live, read from offset 0 through the client's rack and straight from the
    object store, and sum up where the bytes went. Under a minute."""
    from rich.console import Console

    from tierbroker.broker.cli.demo import run

    run(mib, directory, Console())


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
