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
    key_values,
    print_json,
    print_table,
)

app = command_group("The cluster a broker belongs to.")
config_app = command_group("A broker's configs: describe, alter.")
app.add_typer(config_app, name="config")

BrokerId = Annotated[int | None, typer.Option("--broker", help="the broker's id")]
ClusterDefault = Annotated[
    bool,
    typer.Option("--default", help="the cluster-wide defaults instead of one broker's"),
]


def _entity(broker: int | None, cluster_default: bool) -> str:
    """What the configs are of, in messages: a broker, or the cluster's defaults."""
    if (broker is None) == (not cluster_default):
        raise typer.BadParameter("give --broker N or --default")
    return "the cluster defaults" if cluster_default else f"broker {broker}"


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
    broker: BrokerId = None,
    cluster_default: ClusterDefault = False,
    all_configs: Annotated[
        bool, typer.Option("--all-configs", help="defaults too, not just the values set")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """A broker's configs set in its properties file or at run time (--all-configs: all),
    or the dynamic defaults set for the whole cluster (--default)."""
    what = _entity(broker, cluster_default)
    from tierbroker.broker.cli.wire_admin import run_admin

    entries = run_admin(
        f"describe configs of {what}", bootstrap, timeout, lambda a: a.broker_configs(broker)
    )
    configs = [
        {"name": e.name, "value": e.value, "source": e.source}
        for e in entries
        if all_configs or e.source != "DEFAULT_CONFIG"
    ]
    if output is Output.json:
        print_json({"broker": broker, "configs": configs})
        return
    hint = "" if all_configs or cluster_default else " (--all-configs for all)"
    configs_of.print_configs(configs, title=f"{what} configs{hint}", empty="none set")


@config_app.command("alter")
def alter_config(
    broker: BrokerId = None,
    cluster_default: ClusterDefault = False,
    config: configs_of.SetOption = None,
    delete_config: configs_of.DeleteOption = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Set or remove dynamic configs of a broker, or of the whole cluster (--default);
    the others stay as they are. The topic defaults (log.retention.ms, log.segment.bytes,
    log.cleanup.policy, ...) are dynamic, and apply at once to every topic without an
    override."""
    what = _entity(broker, cluster_default)
    changes = key_values(config, "--config")
    if not changes and not delete_config:
        raise typer.BadParameter("give --config key=value or --delete-config key")
    from tierbroker.broker.cli.wire_admin import run_admin

    run_admin(
        f"alter configs of {what}",
        bootstrap,
        timeout,
        lambda a: a.alter_broker_configs(broker, changes, delete_config or []),
    )
    typer.echo(f"altered configs of {what}", err=True)
