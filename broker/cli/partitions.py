"""`tierbroker partition elect-leaders`, as kafka-leader-election.sh does it: leadership
back to each partition's preferred replica (the first of its replicas), or an unclean
election of a leader outside the ISR where the partition has none."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from tierbroker.broker.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    Output,
    OutputOption,
    Timeout,
    admin_client,
    command_group,
    describe_error,
    failing,
    print_json,
    print_table,
)

app = command_group("Partitions: elect leaders.")


class Election(StrEnum):
    preferred = "preferred"
    unclean = "unclean"


@app.command("elect-leaders")
def elect_leaders(
    topic: Annotated[str, typer.Option("--topic", "-t", help="the topic")],
    partition: Annotated[
        list[int] | None, typer.Option("--partition", "-p", help="repeatable; default: all")
    ] = None,
    election: Annotated[
        Election, typer.Option("--election-type", help="preferred, or unclean")
    ] = Election.preferred,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """Elect leaders of a topic's partitions; one that has its leader already says so.
    Exit status 1 if an election failed."""
    from confluent_kafka import (
        ElectionType,
        KafkaError,
        KafkaException,
        TopicCollection,
        TopicPartition,
    )

    what = f"elect leaders of {topic}"
    with failing(what, bootstrap):
        admin = admin_client(bootstrap, timeout)
        if partition:
            numbers = sorted(set(partition))
        else:  # DescribeTopics: a Metadata request naming the topic could create it
            [described] = admin.describe_topics(
                TopicCollection([topic]), request_timeout=timeout
            ).values()
            numbers = sorted(p.id for p in described.result(timeout).partitions)
        kind = ElectionType.PREFERRED if election is Election.preferred else ElectionType.UNCLEAN
        # confluent-kafka 2.16's binding fails on elect_leaders' timeout arguments
        # (SystemError): the client's own timeouts (`admin_client`) bound the call instead.
        future = admin.elect_leaders(kind, [TopicPartition(topic, p) for p in numbers])
        results = future.result(timeout)
    rows = []
    failed = False
    for tp, answer in sorted(results.items(), key=lambda item: item[0].partition):
        # a KafkaError, a KafkaException wrapping one, or None
        error = answer.args[0] if isinstance(answer, KafkaException) else answer
        code = error.code() if error is not None else KafkaError.NO_ERROR
        if code == KafkaError.NO_ERROR:
            outcome = "elected"
        elif code == KafkaError.ELECTION_NOT_NEEDED:
            preferred = election is Election.preferred
            outcome = "already led by its preferred replica" if preferred else "it has a leader"
        else:
            outcome, failed = describe_error(error), True
        rows.append({"partition": tp.partition, "result": outcome})
    if output is Output.json:
        print_json({"topic": topic, "election": election.value, "partitions": rows})
    else:
        print_table(
            ("partition", "result"),
            [(r["partition"], r["result"]) for r in rows],
            title=f"{election.value} election, topic {topic}",
        )
    if failed:  # as kafka-leader-election.sh, whose exit status says an election failed
        raise typer.Exit(1)
