"""`tierbroker cluster info`: the cluster id, its brokers and its controller."""

from __future__ import annotations

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
