"""`tierbroker tier status`: whether the broker's remote store works, and both tiers of
every partition it hosts, from its metrics endpoint (`GET /tier/health`, `/tier/status`);
with `--cost`, what each topic cost instead (`/tier/usage`, priced by `tier_cost`).

The endpoint is found, first match wins: `--url`; the `metrics.port` of a properties
file (`--config`/`--override`); else the broker at `--bootstrap-server` is asked for its
`metrics.port` (DescribeConfigs) and the endpoint is that port on the same host.
"""

from __future__ import annotations

import shutil
import textwrap
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tierbroker.broker.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    Output,
    OutputOption,
    Timeout,
    admin_client,
    command_group,
    fail,
    failing,
    print_json,
    print_table,
    size_text,
)
from tierbroker.broker.cli.metrics_endpoint import get_json, metrics_url
from tierbroker.broker.cli.prices import DEFAULT_TABLE, PriceTableError, price_tables, select
from tierbroker.broker.cli.tier_cost import show_cost

app = command_group("The remote tier of a running broker.")

COLUMNS = ("partition", "log start", "local start", "log end", "local", "remote", "copy lag")


@app.command("status")
def status(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="the broker's properties")
    ] = None,
    override: Annotated[list[str] | None, typer.Option("--override", help="key=value")] = None,
    url: Annotated[
        str | None, typer.Option(help="metrics endpoint, e.g. http://127.0.0.1:9404")
    ] = None,
    topic: Annotated[str | None, typer.Option(help="only this topic")] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
    cost: Annotated[
        bool,
        typer.Option(
            "--cost",
            help="per topic: object-store requests and bytes, bytes fetched by tier and "
            "rack, and their cost",
        ),
    ] = False,
    prices: Annotated[
        Path | None,
        typer.Option(help="JSON price tables over the defaults: {name: {field: USD}}"),
    ] = None,
    price_table: Annotated[
        str,
        typer.Option(help="s3-standard, s3-express-one-zone, gcs-standard, or one of --prices"),
    ] = DEFAULT_TABLE,
) -> None:
    """The remote store's health; per partition: both tiers' offsets, segments and bytes,
    and the copy lag. With --cost, per topic: its object-store requests and bytes, the
    bytes fetched from each tier in and across racks, and their cost in USD."""
    if not cost and (prices is not None or price_table != DEFAULT_TABLE):
        fail("tier status: --prices and --price-table go with --cost", code=2)
    try:
        table = select(price_tables(prices), price_table) if cost else None
    except PriceTableError as e:
        fail(f"tier status: {e}", code=2)
    if url is None:
        url = _from_config(config, override) if config or override else _ask(bootstrap, timeout)
    health = _get(url, "/tier/health", timeout)
    if table is not None:
        usage = _get(url, "/tier/usage", timeout)
        if topic is not None:
            usage["topics"] = {t: u for t, u in usage["topics"].items() if t == topic}
        if output is Output.table:
            typer.echo(_health_line(health))
        show_cost(usage, price_table, table, output is Output.json)
        return
    rows = [r for r in _get(url, "/tier/status", timeout) if topic is None or r["topic"] == topic]
    if output is Output.json:
        print_json({"remote_storage": health, "partitions": rows})
        return
    width = shutil.get_terminal_size().columns
    typer.echo(textwrap.fill(_health_line(health), width, subsequent_indent="  "))
    # One partition per 80-column line: offsets, then segments/size per tier (the
    # remote tier's offsets are in the JSON).
    print_table(
        COLUMNS,
        [
            (
                f"{r['topic']}-{r['partition']}",
                r["log_start_offset"],
                r["local_log_start_offset"],
                r["log_end_offset"],
                _segments(r["local_segments"], r["local_bytes"]),
                _segments(r["remote_segments"], r["remote_bytes"]),
                _segments(r["copy_lag_segments"], r["copy_lag_bytes"]),
            )
            for r in rows
        ],
        title="tiered storage (local, remote, copy lag: segments/size)",
        empty=f"no partitions{f' of {topic}' if topic else ''} led by this broker",
    )


def _get(url: str, path: str, timeout: float) -> Any:
    try:
        return get_json(f"{url}{path}", timeout)
    except (OSError, ValueError) as e:
        fail(f"tier status: cannot read {url}{path}: {e}")


def _health_line(health: dict[str, Any]) -> str:
    state = health["state"]
    if state == "disabled":
        return "remote storage: disabled (remote.log.storage.system.enable=false)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(health["since_ms"] / 1000))
    if state == "unhealthy":
        return f"remote storage: UNHEALTHY since {since}: {health['error']}"
    return f"remote storage: {state} (since {since})"


def _from_config(config: Path | None, override: list[str] | None) -> str:
    from tierbroker.broker.config.broker_config import ConfigError, load_config

    try:
        broker_config = load_config(config, override or [])
    except (ConfigError, OSError) as e:
        fail(f"tier status: {e}", code=2)
    if broker_config.metrics_port < 0:
        fail("tier status: the broker has no metrics endpoint (metrics.port)", code=2)
    host = broker_config.listener_config.advertised[0].host
    return f"http://{host}:{broker_config.metrics_port}"


def _ask(bootstrap: str, timeout: float) -> str:
    """The metrics endpoint of the broker at `bootstrap`, from its own `metrics.port`."""
    admin = admin_client(bootstrap, timeout)
    with failing("tier status: ask the broker for its metrics.port", bootstrap):
        cluster = admin.describe_cluster(request_timeout=timeout).result(timeout)
        host, _, _ = bootstrap.rpartition(":")
        nodes = [n for n in cluster.nodes if f"{n.host}:{n.port}" == bootstrap] or cluster.nodes
        url = metrics_url(admin, nodes[0].id, host, timeout)
    if url is None:
        fail(f"tier status: the broker at {bootstrap} has no metrics endpoint (metrics.port)")
    return url


def _segments(count: int, size_bytes: int) -> str:
    return f"{count}/{size_text(size_bytes)}"
