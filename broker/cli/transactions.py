"""`tierbroker txn list|describe|producers|abort`, as kafka-transactions.sh does them.

`list` asks every broker (ListTransactions), `describe` the transactional id's coordinator
(FindCoordinator, DescribeTransactions), `producers` a partition's leader
(DescribeProducers). `abort` ends a hanging transaction on one partition: it writes the
abort marker through the leader (WriteTxnMarkers) for the producer whose open
transaction starts at `--start-offset`, or for the producer named in full.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Annotated

import typer
from kio.schema.describe_producers.v0 import request as producers_request
from kio.schema.describe_transactions.v0 import request as describe_request
from kio.schema.list_transactions.v1 import request as list_request
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.schema.write_txn_markers.v1 import request as markers_request
from kio.static.primitive import i16, i32, i64

from tierbroker.broker.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    Output,
    OutputOption,
    Timeout,
    command_group,
    print_json,
    print_table,
)
from tierbroker.broker.cli.wire_admin import WireAdmin, WireError, error_text, run_admin
from tierbroker.broker.network.broker_client import BrokerClient
from tierbroker.protocol.errors import ErrorCode

app = command_group("Transactions: list, describe, a partition's producers, abort.")


@dataclass(frozen=True)
class Listed:
    transactional_id: str
    coordinator: int
    producer_id: int
    state: str


@dataclass(frozen=True)
class Described:
    transactional_id: str
    coordinator: int
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    start_time_ms: int  # -1 while no transaction is open
    partitions: tuple[str, ...]  # topic-partition, as Kafka prints them


@dataclass(frozen=True)
class ActiveProducer:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int  # -1 when no transaction is open


async def list_transactions(
    admin: WireAdmin, states: list[str], producer_ids: list[int], duration_ms: int
) -> list[Listed]:
    """Every broker's transactions, filtered as ListTransactions filters them."""
    request = list_request.ListTransactionsRequest(
        state_filters=tuple(states),
        producer_id_filters=tuple(ProducerId(p) for p in producer_ids),
        duration_filter=i64(duration_ms),
    )
    found = []
    for broker_id, client in (await admin.brokers()).items():
        answer = await client.send(request)
        if answer.error_code != ErrorCode.none:
            raise WireError(f"broker {broker_id}: {error_text(answer.error_code, None)}")
        if answer.unknown_state_filters:
            raise WireError(f"unknown states: {', '.join(answer.unknown_state_filters)}")
        found += [
            Listed(str(t.transactional_id), broker_id, int(t.producer_id), t.transaction_state)
            for t in answer.transaction_states
        ]
    return sorted(found, key=lambda t: t.transactional_id)


async def describe_transaction(admin: WireAdmin, transactional_id: str) -> Described:
    coordinator, client = await admin.transaction_coordinator(transactional_id)
    answer = await client.send(
        describe_request.DescribeTransactionsRequest(
            transactional_ids=(TransactionalId(transactional_id),)
        )
    )
    [state] = answer.transaction_states
    if state.error_code != ErrorCode.none:
        raise WireError(error_text(state.error_code, None))
    return Described(
        transactional_id,
        coordinator,
        int(state.producer_id),
        int(state.producer_epoch),
        state.transaction_state,
        int(state.transaction_timeout.total_seconds() * 1000),
        round(state.transaction_start_time.timestamp() * 1000),
        tuple(f"{t.topic}-{p}" for t in state.topics for p in t.partitions),
    )


async def describe_producers(
    leader: BrokerClient, topic: str, partition: int
) -> list[ActiveProducer]:
    """The producers the partition's leader keeps state for."""
    answer = await leader.send(
        producers_request.DescribeProducersRequest(
            topics=(
                producers_request.TopicRequest(
                    name=TopicName(topic), partition_indexes=(i32(partition),)
                ),
            )
        )
    )
    [result] = [p for t in answer.topics for p in t.partitions]
    if result.error_code != ErrorCode.none:
        raise WireError(error_text(result.error_code, result.error_message))
    return [
        ActiveProducer(
            int(p.producer_id),
            int(p.producer_epoch),
            int(p.last_sequence),
            int(p.last_timestamp),
            int(p.coordinator_epoch),
            int(p.current_txn_start_offset),
        )
        for p in result.active_producers
    ]


async def abort_transaction(
    leader: BrokerClient, topic: str, partition: int, producer: ActiveProducer
) -> None:
    """Write an abort marker for `producer`'s open transaction through the leader."""
    answer = await leader.send(
        markers_request.WriteTxnMarkersRequest(
            markers=(
                markers_request.WritableTxnMarker(
                    producer_id=ProducerId(producer.producer_id),
                    producer_epoch=i16(producer.producer_epoch),
                    transaction_result=False,
                    topics=(
                        markers_request.WritableTxnMarkerTopic(
                            name=TopicName(topic), partition_indexes=(i32(partition),)
                        ),
                    ),
                    coordinator_epoch=i32(producer.coordinator_epoch),
                ),
            )
        )
    )
    [code] = [p.error_code for m in answer.markers for t in m.topics for p in t.partitions]
    if code != ErrorCode.none:
        raise WireError(error_text(code, None))


State = Annotated[
    list[str] | None,
    typer.Option("--state", help="repeatable: Ongoing, PrepareCommit, CompleteAbort, ..."),
]
ProducerIds = Annotated[list[int] | None, typer.Option("--producer-id", help="repeatable")]
Topic = Annotated[str, typer.Option("--topic", "-t", help="the partition's topic")]
Partition = Annotated[int, typer.Option("--partition", "-p", help="the partition's number")]


@app.command("list")
def list_command(
    state: State = None,
    producer_id: ProducerIds = None,
    duration_ms: Annotated[
        int, typer.Option("--duration-ms", help="only transactions open at least this long")
    ] = -1,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """The transactional ids every coordinator knows, with their states."""
    rows = run_admin(
        "list transactions",
        bootstrap,
        timeout,
        lambda admin: list_transactions(admin, state or [], producer_id or [], duration_ms),
    )
    if output is Output.json:
        print_json([asdict(r) for r in rows])
        return
    print_table(
        ("transactional id", "coordinator", "producer id", "state"),
        [(r.transactional_id, r.coordinator, r.producer_id, r.state) for r in rows],
        empty="no transactions",
    )


@app.command()
def describe(
    transactional_id: str,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """A transactional id's producer, state, timeout and partitions, from its coordinator."""
    found = run_admin(
        f"describe transaction {transactional_id}",
        bootstrap,
        timeout,
        lambda admin: describe_transaction(admin, transactional_id),
    )
    if output is Output.json:
        print_json(asdict(found))
        return
    started = found.start_time_ms >= 0
    print_table(
        ("coordinator", "producer id", "epoch", "state", "timeout ms", "open ms", "partitions"),
        [
            (
                found.coordinator,
                found.producer_id,
                found.producer_epoch,
                found.state,
                found.timeout_ms,
                int(time.time() * 1000) - found.start_time_ms if started else "-",
                ",".join(found.partitions) or "-",
            )
        ],
        title=f"transaction {transactional_id}",
    )


@app.command()
def producers(
    topic: Topic,
    partition: Partition,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """The producers a partition's leader tracks, and where their open transactions start."""

    async def call(admin: WireAdmin) -> list[ActiveProducer]:
        return await describe_producers(await admin.leader(topic, partition), topic, partition)

    rows = run_admin(f"describe producers of {topic}:{partition}", bootstrap, timeout, call)
    if output is Output.json:
        print_json([asdict(r) for r in rows])
        return
    print_table(
        ("producer id", "epoch", "last sequence", "coordinator epoch", "open transaction at"),
        [
            (
                r.producer_id,
                r.producer_epoch,
                r.last_sequence,
                r.coordinator_epoch,
                r.current_txn_start_offset if r.current_txn_start_offset >= 0 else "-",
            )
            for r in rows
        ],
        title=f"{topic}:{partition}",
        empty="no producers",
    )


@app.command()
def abort(
    topic: Topic,
    partition: Partition,
    start_offset: Annotated[
        int | None,
        typer.Option("--start-offset", help="the first offset of the transaction to abort"),
    ] = None,
    producer_id: Annotated[
        int | None, typer.Option("--producer-id", help="the producer whose transaction to abort")
    ] = None,
    producer_epoch: Annotated[
        int | None, typer.Option("--producer-epoch", help="its epoch (txn producers shows it)")
    ] = None,
    coordinator_epoch: Annotated[
        int | None,
        typer.Option("--coordinator-epoch", help="its coordinator's epoch (txn producers)"),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Abort a hanging transaction on one partition: the one open at --start-offset, or
    that of --producer-id with --producer-epoch and --coordinator-epoch."""
    named = (producer_id, producer_epoch, coordinator_epoch)
    by_offset = start_offset is not None and named == (None, None, None)
    if not by_offset and (start_offset is not None or None in named):
        raise typer.BadParameter(
            "give --start-offset N, or all of --producer-id, --producer-epoch and "
            "--coordinator-epoch"
        )

    async def call(admin: WireAdmin) -> ActiveProducer:
        leader = await admin.leader(topic, partition)
        if start_offset is None:
            assert producer_id is not None and producer_epoch is not None
            assert coordinator_epoch is not None
            producer = ActiveProducer(producer_id, producer_epoch, -1, -1, coordinator_epoch, -1)
        else:
            found = [
                p
                for p in await describe_producers(leader, topic, partition)
                if p.current_txn_start_offset == start_offset
            ]
            if not found:
                raise WireError(f"no transaction open at offset {start_offset}")
            [producer] = found
        await abort_transaction(leader, topic, partition, producer)
        return producer

    producer = run_admin(f"abort transaction on {topic}:{partition}", bootstrap, timeout, call)
    print(
        f"aborted the transaction of producer {producer.producer_id} "
        f"(epoch {producer.producer_epoch}) on {topic}:{partition}"
    )
