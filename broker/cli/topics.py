"""`tierbroker topic create|list|describe|alter-config|add-partitions|delete`, as
kafka-topics.sh and kafka-configs.sh do them, through confluent-kafka's AdminClient."""

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
    wait_each,
)

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
    """A topic's partitions (leader, replicas, ISR) and configs."""
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
    print_table(
        ("partition", "leader", "replicas", "isr"),
        [(p["partition"], p["leader"], _ids(p["replicas"]), _ids(p["isr"])) for p in partitions],
        title=f"topic {topic} ({described.topic_id})",
    )
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


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids))
