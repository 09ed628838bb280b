"""What every client command shares: the bootstrap option, clients configured alike,
one-line errors, and table or JSON output."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def command_group(help: str) -> typer.Typer:
    """A group of subcommands (`topic`, `group`, ...). Help is click's plain text, as
    kcat's and Kafka's scripts print: within 80 columns, and twice as fast to show."""
    return typer.Typer(no_args_is_help=True, rich_markup_mode=None, add_completion=False, help=help)


class Output(StrEnum):
    table = "table"
    json = "json"


Bootstrap = Annotated[
    str,
    typer.Option(
        "--bootstrap-server",
        "-b",
        envvar="TIERBROKER_BOOTSTRAP",
        help="host:port of a broker",
    ),
]
Timeout = Annotated[float, typer.Option("--timeout", help="seconds to wait for the broker")]
OutputOption = Annotated[Output, typer.Option("--output", "-o", help="table or json")]


def client_config(bootstrap: str, timeout_s: float) -> dict[str, Any]:
    """librdkafka settings shared by every command: quiet (errors reach the user once,
    as one line), no request outlives the command's timeout, and the listener's security
    from `--command-config`."""
    from tierbroker.broker.cli.command_config import librdkafka_settings

    timeout_ms = max(int(timeout_s * 1000), 1)
    return {
        "bootstrap.servers": bootstrap,
        "log_level": 0,
        "socket.timeout.ms": max(timeout_ms, 10),
        "socket.connection.setup.timeout.ms": max(timeout_ms, 1000),
        **librdkafka_settings(),
    }


def admin_client(bootstrap: str, timeout_s: float) -> AdminClient:
    """An AdminClient; hold it while its futures run (destroying it cancels them)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(bootstrap, timeout_s))


@contextmanager
def failing(what: str, bootstrap: str) -> Iterator[None]:
    """Turn a failure inside into one line on stderr naming `what` failed, and exit 1;
    a broker that cannot be reached is named by its address."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from confluent_kafka import KafkaError, KafkaException

    unreachable = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN)
    try:
        yield
    except KafkaException as e:
        error = e.args[0] if e.args else e
        if isinstance(error, KafkaError) and error.code() in unreachable:
            fail(f"{what}: cannot reach {bootstrap} ({describe_error(error)})")
        fail(f"{what}: {describe_error(error)}")
    except (FutureTimeout, TimeoutError):
        fail(f"{what}: cannot reach {bootstrap} (timed out)")
    except (OSError, ValueError) as e:
        fail(f"{what}: {e}")


def wait_each(what: str, futures: Mapping[str, Any], bootstrap: str, timeout_s: float) -> None:
    """Wait for each AdminClient future by name; a failure is one line: `what name: why`."""
    for name, future in futures.items():
        with failing(f"{what} {name}", bootstrap):
            future.result(timeout_s)


def describe_error(error: object) -> str:
    """A KafkaError as `NAME: reason`, anything else as its text."""
    from confluent_kafka import KafkaError

    if isinstance(error, KafkaError):
        reason = error.str()
        name = error.name()
        return reason if name.lower() in reason.lower() else f"{name}: {reason}"
    return str(error)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `error: message` on stderr and exit with `code`."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def key_values(pairs: Sequence[str] | None, what: str) -> dict[str, str]:
    """`key=value` strings as a dict; a string without `=` is a usage error."""
    result: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} {pair!r} is not key=value")
        result[key] = value
    return result


def print_json(value: object) -> None:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")


def print_table(
    columns: Sequence[str], rows: Sequence[Sequence[object]], title: str = "", empty: str = ""
) -> None:
    """A borderless table under its title, no wider than the terminal (rich wraps cells
    to fit). Without rows, `empty` says why instead of a table of headers alone."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    if not rows:
        typer.echo("\n".join(filter(None, (title, empty))))
        return

    table = Table(
        box=box.SIMPLE_HEAD,
        header_style="bold",
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
    )
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    console = Console()
    if title:
        console.print(title, highlight=False, markup=False)
    console.print(table)


def size_text(size_bytes: int) -> str:
    """A byte count in three significant digits at most: 512B, 1.5K, 120M."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size_bytes >= scale:
            size = size_bytes / scale
            return f"{size:.0f}{unit}" if size >= 100 else f"{size:.1f}{unit}"
    return f"{size_bytes}B"


def records(count: int) -> str:
    """`count` records, in English: "1 record", "2 records"."""
    return f"{count} record" + ("" if count == 1 else "s")


def show_progress() -> bool:
    """Progress goes to stderr, and only when a person is watching it."""
    return sys.stderr.isatty()
