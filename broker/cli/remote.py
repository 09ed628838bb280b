"""`tierbroker remote verify|restore`: the remote tier's bucket, read and written without
a broker's help: scrub it (`remote_verify`), or recreate a topic on a cluster from it
(`remote_restore`).

The store is `--storage URL` (`file:///dir`, `s3://bucket/prefix?endpoint=...`) with
`--option KEY=VALUE` under the broker's `rsm.config.` names (credentials, endpoint,
region), as `tierbroker export` reads it (`pipeline.storage.open_store`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tierbroker.broker.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    Output,
    OutputOption,
    Timeout,
    admin_client,
    client_config,
    command_group,
    fail,
    failing,
    key_values,
    print_json,
    print_table,
    size_text,
    wait_each,
)

if TYPE_CHECKING:
    from tierbroker.broker.cli.remote_restore import RestorePlan
    from tierbroker.pipeline.storage import ObjectStore

app = command_group("The remote tier's bucket: verify it, restore a topic from it.")

Storage = Annotated[
    str, typer.Option("--storage", metavar="URL", help="file:///dir or s3://bucket/prefix?...")
]
StorageOptions = Annotated[
    list[str] | None,
    typer.Option(
        "--option",
        metavar="KEY=VALUE",
        help="a setting of the store under the broker's rsm.config. name, repeatable",
    ),
]
POLL_S = 0.2  # how often a restore looks at the partitions' ends
DEFAULT_GRACE_MS = 600_000  # ten times the default remote.log.manager.call.timeout.ms


def _store(storage: str, options: list[str] | None) -> ObjectStore:
    from tierbroker.pipeline.storage import open_store

    try:
        return open_store(storage, key_values(options, "--option"))
    except ValueError as e:
        fail(str(e), code=2)


@app.command("verify")
def verify(
    storage: Storage,
    options: StorageOptions = None,
    topic: Annotated[str | None, typer.Option(help="only this topic")] = None,
    grace_ms: Annotated[
        int,
        typer.Option(
            min=0,
            help="objects younger than this are never orphans: they may belong to a copy "
            "in flight, whose manifest comes last",
        ),
    ] = DEFAULT_GRACE_MS,
    delete_orphans: Annotated[
        bool, typer.Option("--delete-orphans", help="delete the orphans (nothing else)")
    ] = False,
    output: OutputOption = Output.table,
) -> None:
    """Check every segment manifest's objects (present, sizes, CRC-32 where recorded) and
    list orphans, objects no manifest names. Exit 1 if anything is wrong (orphans
    deleted with --delete-orphans no longer are)."""
    from tierbroker.broker.cli.remote_bucket import list_partitions
    from tierbroker.broker.cli.remote_verify import verify as scrub

    store = _store(storage, options)
    try:
        with failing("remote verify", store.url):
            reports, deleted = scrub(store, list_partitions(store, topic), grace_ms, delete_orphans)
    finally:
        store.close()
    gone = set(deleted)
    problems = [(r.where, p) for r in reports for p in r.problems if p.key not in gone]
    if output == Output.json:
        print_json(
            {
                "storage": store.url,
                "partitions": [
                    {
                        "topic": r.where.topic,
                        "topic_id": r.where.topic_id,
                        "partition": r.where.partition,
                        "segments": r.segments,
                        "bytes": r.bytes,
                        "index": r.has_index,
                        "problems": len(r.problems),
                    }
                    for r in reports
                ],
                "problems": [
                    {"partition": str(w), "kind": p.kind, "key": p.key, "detail": p.detail}
                    for w, p in problems
                ],
                "deleted": deleted,
            }
        )
    else:
        print_table(
            ("partition", "topic id", "segments", "bytes", "index", "problems"),
            [
                (
                    f"{r.where.topic}-{r.where.partition}",
                    r.where.topic_id,
                    r.segments,
                    size_text(r.bytes),
                    "yes" if r.has_index else "no",
                    len(r.problems),
                )
                for r in reports
            ],
            title=store.url,
            empty="no partition of the remote tier in it",
        )
        if problems:
            print_table(
                ("partition", "problem", "key", "detail"),
                [(str(w), p.kind, p.key, p.detail) for w, p in problems],
            )
        for key in deleted:
            typer.echo(f"deleted orphan {key}")
    if problems:
        raise typer.Exit(1)


@app.command("restore")
def restore(
    topic: Annotated[str, typer.Option(help="the topic to restore")],
    storage: Storage,
    options: StorageOptions = None,
    topic_id: Annotated[
        str | None, typer.Option(help="the topic id, when the bucket holds several of the name")
    ] = None,
    replication_factor: Annotated[
        int, typer.Option(help="replicas per partition (-1: the brokers' default)")
    ] = -1,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 60.0,
    output: OutputOption = Output.table,
) -> None:
    """Recreate TOPIC on a cluster where it does not exist, from the bucket alone: same
    topic id, configs and partitions; every segment's remote metadata; each partition's
    log continuing after its remote history, and starting where it started. Produce to
    the topic once this has finished."""
    from tierbroker.broker.cli.remote_restore import RestoreError, plan_restore

    store = _store(storage, options)
    try:
        with failing("remote restore", store.url):
            plan = plan_restore(store, topic, topic_id)
    except RestoreError as e:
        fail(f"remote restore: {e}")
    finally:
        store.close()
    with failing(f"remote restore {topic}", bootstrap):
        _restore_on_cluster(plan, replication_factor, bootstrap, timeout)
    rows = [
        {
            "partition": p.partition,
            "segments": len(p.segments),
            "first_offset": p.first_offset,
            "end_offset": p.end_offset,
            "log_start_offset": p.log_start_offset,
            "bytes": p.size_bytes,
        }
        for p in plan.partitions
    ]
    if output == Output.json:
        print_json({"topic": plan.topic, "topic_id": plan.topic_id, "partitions": rows})
        return
    print_table(
        ("partition", "segments", "remote offsets", "log start", "bytes"),
        [
            (
                r["partition"],
                r["segments"],
                f"{r['first_offset']}-{r['end_offset'] - 1}" if r["segments"] else "-",
                r["log_start_offset"],
                size_text(r["bytes"]),
            )
            for r in rows
        ],
        title=f"restored {plan.topic} ({plan.topic_id}), first leader epoch "
        f"{plan.first_leader_epoch}",
    )


def _restore_on_cluster(
    plan: RestorePlan, replication_factor: int, bootstrap: str, timeout_s: float
) -> None:
    from confluent_kafka.admin import NewTopic

    from tierbroker.broker.cli.remote_restore import METADATA_TOPIC, create_configs

    admin = admin_client(bootstrap, timeout_s)
    topics = admin.list_topics(timeout=timeout_s).topics
    if plan.topic in topics:
        fail(f"remote restore: topic {plan.topic!r} exists on the cluster at {bootstrap}")
    if METADATA_TOPIC not in topics:
        fail(
            f"remote restore: the cluster at {bootstrap} has no {METADATA_TOPIC}: are its "
            "brokers tiered (remote.log.storage.system.enable=true)?"
        )
    _publish_metadata(plan, len(topics[METADATA_TOPIC].partitions), bootstrap, timeout_s)
    wanted = NewTopic(
        plan.topic, plan.partition_count, replication_factor, config=create_configs(plan)
    )
    created = admin.create_topics([wanted], request_timeout=timeout_s)
    wait_each("creating topic", created, bootstrap, timeout_s)
    _wait_for_history(plan, bootstrap, timeout_s)
    moves = [p for p in plan.partitions if p.log_start_offset > p.first_offset]
    if moves:
        from confluent_kafka import TopicPartition

        futures = admin.delete_records(
            [TopicPartition(plan.topic, p.partition, p.log_start_offset) for p in moves],
            request_timeout=timeout_s,
        )
        wait_each(
            "moving the log start of", {str(k): f for k, f in futures.items()}, bootstrap, timeout_s
        )


def _publish_metadata(
    plan: RestorePlan, metadata_partitions: int, bootstrap: str, timeout_s: float
) -> None:
    from confluent_kafka import Producer

    from tierbroker.broker.cli.remote_restore import METADATA_TOPIC, metadata_records

    failures: list[Any] = []
    producer = Producer(
        {**client_config(bootstrap, timeout_s), "acks": "all", "enable.idempotence": True}
    )
    for partition, key, value in metadata_records(plan, metadata_partitions):
        producer.produce(
            METADATA_TOPIC,
            value,
            key,
            partition=partition,
            on_delivery=lambda error, _m: failures.append(error) if error else None,
        )
        producer.poll(0)
    if producer.flush(timeout_s) or failures:
        why = failures[0] if failures else "timed out"
        fail(f"remote restore: publishing the remote metadata to {METADATA_TOPIC}: {why}")


def _wait_for_history(plan: RestorePlan, bootstrap: str, timeout_s: float) -> None:
    """Until each partition's end reaches its remote history's (its leader started after
    it), within `timeout_s`."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {**client_config(bootstrap, timeout_s), "group.id": "tierbroker-remote-restore"}
    )
    try:
        deadline = time.monotonic() + timeout_s
        pending = {p.partition: p.end_offset for p in plan.partitions if p.end_offset > 0}
        while pending:
            for partition, end in list(pending.items()):
                tp = TopicPartition(plan.topic, partition)
                _low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
                if high >= end:
                    del pending[partition]
            if pending and time.monotonic() >= deadline:
                fail(
                    f"remote restore: partitions {sorted(pending)} of {plan.topic} have not "
                    f"reached the end of their remote history within {timeout_s:g} s"
                )
            if pending:
                time.sleep(POLL_S)
    finally:
        consumer.close()
