"""`tierbroker cluster info`: the cluster id, its brokers and its controller;
`tierbroker cluster config describe|alter`: a broker's configs, as kafka-configs.sh
--entity-type brokers shows and changes them."""

from __future__ import annotations

from typing import Annotated

import typer

from tierbroker.broker.cli import configs as configs_of
from tierbroker.broker.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    Output,
    OutputOption,
    Timeout,
    admin_client,
    command_group,
    failing,
    print_json,
    print_table,
)

app = command_group("The cluster a broker belongs to.")
config_app = command_group("A broker's configs: describe, alter.")
app.add_typer(config_app, name="config")

BrokerId = Annotated[int, typer.Option("--broker", help="the broker's id")]


@app.command()
def info(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """Cluster id, brokers (id, host:port, rack) and the controller."""
    with failing("describe cluster", bootstrap):
        admin = admin_client(bootstrap, timeout)
        cluster = admin.describe_cluster(request_timeout=timeout).result(timeout)
    controller = cluster.controller.id if cluster.controller is not None else None
    brokers = [
        {"id": n.id, "host": n.host, "port": n.port, "rack": n.rack}
        for n in sorted(cluster.nodes, key=lambda n: n.id)
    ]
    if output is Output.json:
        print_json({"cluster_id": cluster.cluster_id, "controller": controller, "brokers": brokers})
        return
    print_table(
        ("broker", "address", "rack", "controller"),
        [
            (
                b["id"],
                f"{b['host']}:{b['port']}",
                b["rack"] or "-",
                "*" if b["id"] == controller else "",
            )
            for b in brokers
        ],
        title=f"cluster {cluster.cluster_id}",
    )


@config_app.command("describe")
def describe_config(
    broker: BrokerId,
    all_configs: Annotated[
        bool, typer.Option("--all-configs", help="defaults too, not just the values set")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """A broker's configs set in its properties file or at run time (--all-configs: all)."""
    with failing(f"describe configs of broker {broker}", bootstrap):
        admin = admin_client(bootstrap, timeout)
        configs = configs_of.described(admin, "broker", str(broker), timeout)
    shown = [c for c in configs if all_configs or c["source"] != "DEFAULT_CONFIG"]
    if output is Output.json:
        print_json({"broker": broker, "configs": shown})
        return
    configs_of.print_configs(
        shown,
        title=f"broker {broker} configs" + ("" if all_configs else " (--all-configs for all)"),
        empty="none set",
    )


@config_app.command("alter")
def alter_config(
    broker: BrokerId,
    config: configs_of.SetOption = None,
    delete_config: configs_of.DeleteOption = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Set or remove a broker's dynamic configs; the others stay as they are."""
    configs_of.alter("broker", str(broker), config, delete_config, bootstrap, timeout)
