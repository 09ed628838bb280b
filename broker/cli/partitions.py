"""`tierbroker partition`: what kafka-leader-election.sh and kafka-reassign-partitions.sh do.

`elect-leaders` gives leadership back to each partition's preferred replica (the first of
its replicas), or elects a leader outside the ISR where a partition has none (unclean).
`reassign` moves partitions to other brokers, shows how far the moves are, or cancels them.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
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
    describe_error,
    failing,
    print_json,
    print_table,
)

if TYPE_CHECKING:
    from tierbroker.broker.cli.wire_admin import Move, Ongoing, WireAdmin

app = command_group("Partitions: elect leaders, move them to other brokers.")


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


class Reassign(StrEnum):
    execute = "execute"
    verify = "verify"
    cancel = "cancel"


@app.command()
def reassign(
    moves: Annotated[
        list[str],
        typer.Argument(
            metavar="TOPIC:PARTITION=BROKER,...",
            help="a partition and its new replicas, the first preferred as leader",
        ),
    ],
    verify: Annotated[
        bool, typer.Option("--verify", help="show how far each move is; exit 1 until all done")
    ] = False,
    cancel: Annotated[
        bool, typer.Option("--cancel", help="stop each move: back to the replicas it had")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """Move partitions to other brokers while they serve; the new replicas copy the log
    from the leader, and the old ones are dropped once the new ones are in the ISR. The
    same arguments with --verify show the progress, with --cancel stop the moves (there
    the replicas after `=` may be left out). Exit status 1 if a partition failed."""
    from tierbroker.broker.cli.wire_admin import Move, parse_move, run_admin

    if verify and cancel:
        raise typer.BadParameter("--verify and --cancel exclude each other")
    mode = Reassign.verify if verify else Reassign.cancel if cancel else Reassign.execute
    try:
        parsed = [parse_move(spec) for spec in moves]
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if mode is Reassign.cancel:  # a cancel names no replicas: the original ones come back
        parsed = [Move(m.topic, m.partition, None) for m in parsed]
    elif any(m.replicas is None for m in parsed):
        raise typer.BadParameter("name each partition's new replicas: TOPIC:PARTITION=BROKER,...")
    rows, failed = run_admin(
        f"{mode.value} reassignment",
        bootstrap,
        timeout,
        lambda admin: _reassign(admin, mode, parsed),
    )
    if output is Output.json:
        print_json({"mode": mode.value, "partitions": rows})
    else:
        print_table(
            ("partition", "replicas", "target", "result"),
            [(r["partition"], _ids(r["replicas"]), _ids(r["target"]), r["result"]) for r in rows],
        )
    if failed:
        raise typer.Exit(1)


async def _reassign(
    admin: WireAdmin, mode: Reassign, moves: list[Move]
) -> tuple[list[dict[str, Any]], bool]:
    """One row per move, and whether any failed (or, verifying, is not done)."""
    # the replicas before the move: to move back, run `reassign` with them as target
    before = await admin.replicas([m.topic for m in moves])
    if mode is Reassign.verify:
        ongoing = await admin.ongoing_reassignments(moves)
        outcomes = {m: _progress(m, before, ongoing) for m in moves}
    else:
        errors = await admin.alter_reassignments(moves)
        done = "started" if mode is Reassign.execute else "cancelled"
        outcomes = {m: (error or done, error is not None) for m, error in errors.items()}
    rows = [
        {
            "partition": m.name,
            "replicas": before.get((m.topic, m.partition)),
            "target": m.replicas,
            "result": outcomes[m][0],
        }
        for m in moves
    ]
    return rows, any(failed for _, failed in outcomes.values())


def _progress(
    move: Move,
    replicas: dict[tuple[str, int], tuple[int, ...]],
    ongoing: dict[tuple[str, int], Ongoing],
) -> tuple[str, bool]:
    """Where a move stands, as kafka-reassign-partitions.sh --verify says it; and whether
    it is not done."""
    key = (move.topic, move.partition)
    if key not in replicas:
        return "UNKNOWN_TOPIC_OR_PARTITION", True
    if key in ongoing:
        now = ongoing[key]
        return f"in progress: adding {_ids(now.adding)}, removing {_ids(now.removing)}", True
    if replicas[key] == move.replicas:
        return "complete", False
    return "not in progress, and the replicas differ", True


def _ids(brokers: Sequence[int] | None) -> str:
    return "" if brokers is None else ",".join(map(str, brokers))
