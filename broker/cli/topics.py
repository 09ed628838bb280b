"""`tierbroker topic create|list|describe|alter-config|add-partitions|delete`, as
kafka-topics.sh and kafka-configs.sh do them, through confluent-kafka's AdminClient.
`describe` of a compacted topic adds each partition's dirty ratio, as its leader's
cleaner reports it on the leader's metrics endpoint (`GET /cleaner/status`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

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
    wait_each,
)
from tierbroker.broker.cli.metrics_endpoint import get_json, metrics_url

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

app = command_group("Create, list, describe, configure and delete topics.")

ConfigOption = Annotated[list[str] | None, typer.Option("--config", help="key=value, repeatable")]


@app.command()
def create(
    topic: str,
    partitions: Annotated[
        int, typer.Option("--partitions", "-p", help="-1: the broker's num.partitions")
    ] = -1,
    replication_factor: Annotated[
        int,
        typer.Option("--replication-factor", "-r", help="-1: default.replication.factor"),
    ] = -1,
    config: ConfigOption = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Create a topic."""
    from confluent_kafka.admin import NewTopic

    configs = key_values(config, "--config")
    with failing(f"create topic {topic}", bootstrap):
        new = NewTopic(topic, partitions, replication_factor, config=configs)
        admin = admin_client(bootstrap, timeout)  # kept alive until its futures are done
        futures = admin.create_topics([new], request_timeout=timeout, operation_timeout=timeout)
        futures[topic].result(timeout)
    typer.echo(f"created topic {topic}", err=True)


@app.command("list")
def list_topics(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """List topics with their partition count and replication factor."""
    with failing("list topics", bootstrap):
        admin = admin_client(bootstrap, timeout)
        metadata = admin.list_topics(timeout=timeout)
    rows = [
        {
            "name": name,
            "partitions": len(t.partitions),
            "replication_factor": max((len(p.replicas) for p in t.partitions.values()), default=0),
        }
        for name, t in sorted(metadata.topics.items())
    ]
    if output is Output.json:
        print_json(rows)
    else:
        print_table(
            ("topic", "partitions", "replicas"),
            [(r["name"], r["partitions"], r["replication_factor"]) for r in rows],
            empty="no topics",
        )


@app.command()
def describe(
    topic: str,
    all_configs: Annotated[
        bool, typer.Option("--all-configs", help="defaults too, not just overrides")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """A topic's partitions (leader, replicas, ISR; if compacted, how dirty) and configs."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import ConfigSource

    admin = admin_client(bootstrap, timeout)
    with failing(f"describe topic {topic}", bootstrap):
        [description] = admin.describe_topics(
            TopicCollection([topic]), request_timeout=timeout
        ).values()
        described = description.result(timeout)
        configs = configs_of.described(admin, topic, timeout)
    partitions = [
        {
            "partition": p.id,
            "leader": p.leader.id if p.leader is not None else None,
            "replicas": [n.id for n in p.replicas],
            "isr": [n.id for n in p.isr],
        }
        for p in sorted(described.partitions, key=lambda p: p.id)
    ]
    compacted = _compacted(configs)
    if compacted:
        ratios = _dirty_ratios(admin, topic, described.partitions, timeout)
        for row in partitions:
            row["dirty_ratio"] = ratios.get(row["partition"])
    if output is Output.json:
        print_json(
            {
                "name": topic,
                "topic_id": str(described.topic_id),
                "internal": described.is_internal,
                "partitions": partitions,
                "configs": configs,
            }
        )
        return
    _print_partitions(partitions, compacted, title=f"topic {topic} ({described.topic_id})")
    shown = [
        c for c in configs if all_configs or c["source"] == ConfigSource.DYNAMIC_TOPIC_CONFIG.name
    ]
    configs_of.print_configs(
        shown,
        title="configs" if all_configs else "config overrides (--all-configs for all)",
        empty="none",
    )


@app.command("alter-config")
def alter_config(
    topic: str,
    config: configs_of.SetOption = None,
    delete_config: configs_of.DeleteOption = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Set or remove a topic's config overrides; the others stay as they are."""
    configs_of.alter(topic, config, delete_config, bootstrap, timeout)


@app.command("add-partitions")
def add_partitions(
    topic: str,
    partitions: Annotated[
        int, typer.Option("--partitions", "-p", min=1, help="the new partition count")
    ],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Grow a topic to --partitions partitions (kafka-topics.sh --alter --partitions)."""
    from confluent_kafka.admin import NewPartitions

    with failing(f"add partitions to {topic}", bootstrap):
        admin = admin_client(bootstrap, timeout)
        futures = admin.create_partitions(
            [NewPartitions(topic, partitions)], request_timeout=timeout, operation_timeout=timeout
        )
        futures[topic].result(timeout)
    typer.echo(f"topic {topic} has {partitions} partitions", err=True)


@app.command()
def delete(
    topics: Annotated[list[str], typer.Argument(help="one or more topics")],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Delete topics."""
    with failing(f"delete topic {' '.join(topics)}", bootstrap):
        admin = admin_client(bootstrap, timeout)
        futures = admin.delete_topics(topics, request_timeout=timeout, operation_timeout=timeout)
        wait_each("delete topic", futures, bootstrap, timeout)
    typer.echo(f"deleted topic {' '.join(topics)}", err=True)


def _compacted(configs: list[dict[str, Any]]) -> bool:
    """Whether `cleanup.policy`, among `configs`, holds `compact`."""
    policy = next((c["value"] for c in configs if c["name"] == "cleanup.policy"), None)
    return "compact" in (policy or "").split(",")


def _dirty_ratios(
    admin: AdminClient, topic: str, partitions: list[Any], timeout: float
) -> dict[int, float]:
    """By partition id, the dirty ratio (0 to 1) each partition's leader reports; a
    partition is left out if its leader has no metrics endpoint or does not answer."""
    leaders = {p.leader.id: p.leader.host for p in partitions if p.leader is not None}
    ratios: dict[int, float] = {}
    for broker_id, host in leaders.items():
        led = {p.id for p in partitions if p.leader is not None and p.leader.id == broker_id}
        for row in _cleaner_status(admin, broker_id, host, timeout):
            if row["topic"] == topic and row["partition"] in led:
                ratios[row["partition"]] = row["dirty_ratio"]
    return ratios


def _cleaner_status(
    admin: AdminClient, broker_id: int, host: str, timeout: float
) -> list[dict[str, Any]]:
    """Broker `broker_id`'s `/cleaner/status` rows; none if it has no metrics endpoint or
    does not answer (the describe goes on without them)."""
    from confluent_kafka import KafkaException

    try:
        url = metrics_url(admin, broker_id, host, timeout)
        return [] if url is None else list(get_json(f"{url}/cleaner/status", timeout))
    except (KafkaException, OSError, ValueError):
        return []


def _print_partitions(partitions: list[dict[str, Any]], compacted: bool, title: str) -> None:
    """One row per partition: leader, replicas, ISR and, if compacted, the dirty ratio as
    a percentage ("-" where the leader did not say)."""
    columns = ["partition", "leader", "replicas", "isr"]
    rows = [[p["partition"], p["leader"], _ids(p["replicas"]), _ids(p["isr"])] for p in partitions]
    if compacted:
        columns.append("dirty")
        for row, p in zip(rows, partitions, strict=True):
            ratio = p["dirty_ratio"]
            row.append("-" if ratio is None else f"{ratio:.1%}")
    print_table(columns, rows, title=title)


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids))
