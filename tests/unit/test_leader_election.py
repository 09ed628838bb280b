"""The elections an operator asks for, and the controller's leader balance, as Kafka decides
them."""

from __future__ import annotations

from collections.abc import Callable

from tierbroker.broker.controller.leader_election import (
    ElectionType,
    elect,
    imbalanced_partitions,
)
from tierbroker.broker.metadata.zk_data import NO_LEADER, PartitionState
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition

PREFERRED, UNCLEAN = ElectionType.PREFERRED, ElectionType.UNCLEAN


def state(leader: int, isr: tuple[int, ...], epoch: int = 3) -> PartitionState:
    return PartitionState(leader, epoch, isr, controller_epoch=1, partition_epoch=7)


def alive(*brokers: int) -> Callable[[int], bool]:
    return lambda b: b in brokers


def test_the_preferred_replica_takes_over_in_a_new_leader_epoch() -> None:
    outcome = elect(PREFERRED, [1, 2, 3], state(2, (2, 3, 1)), alive(1, 2, 3), controller_epoch=5)
    assert outcome.error == ErrorCode.none
    assert outcome.state == PartitionState(1, 4, (2, 3, 1), 5, 7)  # written over version 7


def test_a_preferred_election_that_is_not_needed_or_not_possible() -> None:
    leading = elect(PREFERRED, [1, 2], state(1, (1, 2)), alive(1, 2), 5)
    assert (leading.error, leading.state) == (ErrorCode.election_not_needed, None)
    out_of_isr = elect(PREFERRED, [1, 2], state(2, (2,)), alive(1, 2), 5)
    assert (out_of_isr.error, out_of_isr.state) == (ErrorCode.preferred_leader_not_available, None)
    dead = elect(PREFERRED, [1, 2], state(2, (2, 1)), alive(2), 5)
    assert dead.error == ErrorCode.preferred_leader_not_available


def test_an_unclean_election_prefers_the_live_isr_then_any_live_replica() -> None:
    led = elect(UNCLEAN, [1, 2, 3], state(1, (1, 2)), alive(1, 2, 3), 5)
    assert led.error == ErrorCode.election_not_needed
    from_isr = elect(UNCLEAN, [1, 2, 3], state(NO_LEADER, (3, 2)), alive(2, 3), 5)
    assert from_isr.state is not None and (from_isr.state.leader, from_isr.state.isr) == (2, (3, 2))
    from_outside = elect(UNCLEAN, [1, 2, 3], state(1, (1,)), alive(3), 5)
    assert from_outside.state is not None
    assert (from_outside.state.leader, from_outside.state.isr) == (3, (3,))
    assert elect(UNCLEAN, [1, 2], state(1, (1,)), alive(), 5).error == (
        ErrorCode.eligible_leaders_not_available
    )


def test_leadership_goes_back_only_past_the_imbalance_percentage() -> None:
    tps = [TopicPartition("t", p) for p in range(10)]
    replicas = {tp: [1, 2] for tp in tps}  # broker 1 is preferred for all ten
    states = {tp: state(1, (1, 2)) for tp in tps}
    states[tps[0]] = state(2, (2, 1))  # one of ten elsewhere: 10%, not above it
    assert imbalanced_partitions(replicas, states, alive(1, 2), 10) == []
    states[tps[1]] = state(2, (2,))  # two of ten: above
    assert imbalanced_partitions(replicas, states, alive(1, 2), 10) == tps[:2]
    assert imbalanced_partitions(replicas, states, alive(2), 10) == []  # broker 1 is down
