"""`tierbroker group list|describe|reset-offsets|delete`, as kafka-consumer-groups.sh
does them: reset-offsets only shows its plan unless `--execute` is given, and only resets
a group with no members; delete refuses a group with members (NON_EMPTY_GROUP)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

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
    wait_each,
)

if TYPE_CHECKING:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

app = command_group("Consumer groups: list, describe, reset offsets, delete.")

INACTIVE_STATES = ("EMPTY", "DEAD", "UNKNOWN")


@app.command("list")
def list_groups(
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """List consumer groups and their states."""
    with failing("list groups", bootstrap):
        admin = admin_client(bootstrap, timeout)
        result = admin.list_consumer_groups(request_timeout=timeout).result(timeout)
    rows = [
        {"group": g.group_id, "state": g.state.name, "simple": g.is_simple_consumer_group}
        for g in sorted(result.valid, key=lambda g: g.group_id)
    ]
    if output is Output.json:
        print_json(rows)
    else:
        print_table(
            ("group", "state"),
            [(r["group"], r["state"].lower()) for r in rows],
            empty="no consumer groups",
        )


@app.command()
def describe(
    group: str,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """Members, their assignments, committed offsets and lag, per partition."""
    admin = admin_client(bootstrap, timeout)
    with failing(f"describe group {group}", bootstrap):
        description = admin.describe_consumer_groups([group], request_timeout=timeout)[
            group
        ].result(timeout)
        committed = _committed(admin, group, timeout)
        if description.state.name == "DEAD" and not committed:
            fail(f"describe group {group}: no such group")
        owners = {
            (tp.topic, tp.partition): member
            for member in description.members
            for tp in member.assignment.topic_partitions
        }
        keys = sorted(set(committed) | set(owners))
        ends = _offsets(admin, keys, "latest", timeout)
    partitions = []
    for topic, partition in keys:
        offset = committed.get((topic, partition))
        end = ends[(topic, partition)]
        member = owners.get((topic, partition))
        partitions.append(
            {
                "topic": topic,
                "partition": partition,
                "committed_offset": offset,
                "log_end_offset": end,
                "lag": None if offset is None else max(end - offset, 0),
                "member_id": member.member_id if member else None,
                "client_id": member.client_id if member else None,
                "host": member.host if member else None,
            }
        )
    state = description.state.name
    members = [
        {
            "member_id": m.member_id,
            "client_id": m.client_id,
            "host": m.host,
            "group_instance_id": m.group_instance_id,
            "assignment": [
                {"topic": tp.topic, "partition": tp.partition}
                for tp in m.assignment.topic_partitions
            ],
        }
        for m in description.members
    ]
    if output is Output.json:
        print_json(
            {
                "group": group,
                "state": state,
                "assignor": description.partition_assignor,
                "coordinator": description.coordinator.id if description.coordinator else None,
                "members": members,
                "partitions": partitions,
            }
        )
        return
    print_table(
        ("topic", "part", "committed", "log end", "lag", "client", "host"),
        [
            (
                p["topic"],
                p["partition"],
                _dash(p["committed_offset"]),
                p["log_end_offset"],
                _dash(p["lag"]),
                p["client_id"] or "-",
                p["host"] or "-",
            )
            for p in partitions
        ],
        title=f"group {group}: {state.lower()}, {len(members)} member(s)",
        empty="no committed offsets",
    )


@app.command("reset-offsets")
def reset_offsets(
    group: str,
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", "-t", help="repeatable; default: the topics the group committed"),
    ] = None,
    to_earliest: Annotated[
        bool, typer.Option("--to-earliest", help="to each partition's log start")
    ] = False,
    to_latest: Annotated[
        bool, typer.Option("--to-latest", help="to each partition's log end")
    ] = False,
    to_offset: Annotated[
        int | None,
        typer.Option("--to-offset", help="to offset N on each partition, kept within its log"),
    ] = None,
    shift_by: Annotated[
        int | None,
        typer.Option("--shift-by", help="N records on (or -N back) from each committed offset"),
    ] = None,
    to_datetime: Annotated[
        str | None,
        typer.Option(
            "--to-datetime",
            help="to the first record at or after an ISO time (2026-01-31T12:00:00, local "
            "time unless it names a zone); the log end where there is none",
        ),
    ] = None,
    execute: Annotated[
        bool, typer.Option("--execute", help="commit the new offsets (default: only show them)")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """Move a group's committed offsets; a dry run unless --execute."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    chosen = [to_earliest, to_latest, to_offset is not None, shift_by is not None, to_datetime]
    if sum(map(bool, chosen)) != 1:
        raise typer.BadParameter(
            "give exactly one of --to-earliest, --to-latest, --to-offset N, --shift-by N, "
            "--to-datetime TIME"
        )
    timestamp_ms = _timestamp_ms(to_datetime) if to_datetime else None
    admin = admin_client(bootstrap, timeout)
    with failing(f"reset offsets of group {group}", bootstrap):
        state = (
            admin.describe_consumer_groups([group], request_timeout=timeout)[group]
            .result(timeout)
            .state.name
        )
        if execute and state not in INACTIVE_STATES:
            fail(f"group {group} is {state.lower()}: stop its consumers before resetting offsets")
        committed = _committed(admin, group, timeout)
        keys = _partitions(admin, topic, committed, timeout)
        starts = _offsets(admin, keys, "earliest", timeout)
        ends = _offsets(admin, keys, "latest", timeout)
        by_time = _offsets(admin, keys, timestamp_ms, timeout) if timestamp_ms is not None else {}
        plan = []
        for key in keys:
            if to_earliest:
                new = starts[key]
            elif to_latest:
                new = ends[key]
            elif to_offset is not None:
                new = to_offset
            elif shift_by is not None:
                if key not in committed:
                    fail(f"reset offsets: --shift-by: {key[0]}-{key[1]} has no committed offset")
                new = committed[key] + shift_by
            else:
                new = by_time[key] if by_time[key] >= 0 else ends[key]
            plan.append((key, committed.get(key), min(max(new, starts[key]), ends[key])))
        if execute and plan:
            request = ConsumerGroupTopicPartitions(
                group, [TopicPartition(t, p, new) for (t, p), _, new in plan]
            )
            result = admin.alter_consumer_group_offsets([request], request_timeout=timeout)[
                group
            ].result(timeout)
            for tp in result.topic_partitions:
                if tp.error is not None:
                    fail(f"reset offsets of group {group}: {tp.topic}-{tp.partition}: {tp.error}")
    rows = [
        {"topic": t, "partition": p, "committed_offset": old, "new_offset": new}
        for (t, p), old, new in plan
    ]
    if output is Output.json:
        print_json({"group": group, "executed": execute, "partitions": rows})
    else:
        print_table(
            ("topic", "part", "committed", "new offset"),
            [
                (r["topic"], r["partition"], _dash(r["committed_offset"]), r["new_offset"])
                for r in rows
            ],
            title=f"group {group}: "
            + ("offsets reset" if execute else "dry run (--execute to apply)"),
        )


@app.command()
def delete(
    groups: Annotated[list[str], typer.Argument(help="one or more groups, without members")],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Delete groups and their committed offsets (kafka-consumer-groups.sh --delete)."""
    with failing(f"delete group {' '.join(groups)}", bootstrap):
        admin = admin_client(bootstrap, timeout)
        futures = admin.delete_consumer_groups(groups, request_timeout=timeout)
        wait_each("delete group", futures, bootstrap, timeout)
    typer.echo(f"deleted group {' '.join(groups)}", err=True)


def _committed(admin: AdminClient, group: str, timeout: float) -> dict[tuple[str, int], int]:
    """The group's committed offset per partition (partitions without one left out)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    result = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=timeout
    )[group].result(timeout)
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in result.topic_partitions or ()
        if tp.offset >= 0
    }


def _partitions(
    admin: AdminClient,
    topics: list[str] | None,
    committed: dict[tuple[str, int], int],
    timeout: float,
) -> list[tuple[str, int]]:
    """Every partition of `topics`, or of the topics the group has committed to."""
    if not topics and not committed:
        fail("reset offsets: the group has committed no offsets; name the topics (--topic)")
    names = sorted(set(topics) if topics else {t for t, _ in committed})
    metadata = admin.list_topics(timeout=timeout)
    keys = []
    for name in names:
        found = metadata.topics.get(name)
        if found is None or found.error is not None:
            fail(f"reset offsets: unknown topic {name}")
        keys += [(name, p) for p in sorted(found.partitions)]
    return keys


def _timestamp_ms(text: str) -> int:
    """An ISO 8601 time as epoch milliseconds; without a zone, in local time (as Kafka's
    kafka-consumer-groups.sh reads --to-datetime)."""
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an ISO time like 2026-01-31T12:00:00") from None


def _offsets(
    admin: AdminClient, keys: list[tuple[str, int]], spec: str | int, timeout: float
) -> dict[tuple[str, int], int]:
    """Each partition's log start (`earliest`), log end (`latest`), or first offset at or
    after a timestamp in ms (-1 where there is none)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    if not keys:
        return {}
    # the client leaves earliest and latest unannotated
    earliest, latest = OffsetSpec.earliest, OffsetSpec.latest
    if isinstance(spec, int):
        offset_spec = OffsetSpec.for_timestamp(spec)
    else:
        offset_spec = earliest() if spec == "earliest" else latest()  # type: ignore[no-untyped-call, unused-ignore]
    requests: dict[TopicPartition, Any] = {TopicPartition(t, p): offset_spec for t, p in keys}
    futures = admin.list_offsets(requests, request_timeout=timeout)
    return {(tp.topic, tp.partition): f.result(timeout).offset for tp, f in futures.items()}


def _dash(value: object) -> object:
    return "-" if value is None else value
