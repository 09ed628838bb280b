"""Planning a partition reassignment as Kafka's controller does: the replica sets while
moving, the checks of a target, the step that starts a move and the one that ends it."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from tierbroker.broker.controller.reassignment import (
    ReplicaAssignment,
    complete,
    start,
    validate_cancel,
    validate_target,
    with_partition,
)
from tierbroker.broker.metadata.zk_data import PartitionState, TopicAssignment
from tierbroker.protocol.errors import ErrorCode

EPOCH = 7  # the controller's


def alive(*brokers: int) -> Callable[[int], bool]:
    return lambda b: b in brokers


def state(leader: int, isr: tuple[int, ...], leader_epoch: int = 3) -> PartitionState:
    return PartitionState(leader, leader_epoch, isr, 1, partition_epoch=11)


def test_a_move_lists_target_then_original_replicas_with_adding_and_removing() -> None:
    moving = ReplicaAssignment((1, 2, 3)).reassign_to([4, 5, 6])
    assert moving == ReplicaAssignment((4, 5, 6, 1, 2, 3), (4, 5, 6), (1, 2, 3))
    assert moving.origin == (1, 2, 3) and moving.target == (4, 5, 6)
    overlapping = ReplicaAssignment((1, 2, 3)).reassign_to([3, 4, 2])
    assert overlapping == ReplicaAssignment((3, 4, 2, 1), (4,), (1,))


def test_a_new_move_replaces_one_in_progress_keeping_the_original_replicas() -> None:
    moving = ReplicaAssignment((4, 5, 1, 2), (4, 5), (1, 2))
    assert moving.reassign_to([6, 1]) == ReplicaAssignment((6, 1, 2), (6,), (2,))
    assert moving.reassign_to(moving.origin) == ReplicaAssignment((1, 2))


def test_targets_are_checked_as_kafka_checks_them() -> None:
    current = ReplicaAssignment((0, 1, 2))
    live = [0, 1, 2, 3]
    rejected = {
        (): "Empty replica list",
        (1, 1, 2): "Duplicate replica ids",
        (1, -2, 3): "Invalid broker id",
        (1, 2, 9): "brokers that are not alive",
    }
    for target, message in rejected.items():
        rejection = validate_target(target, current, state(0, (0, 1, 2)), live)
        assert rejection is not None and rejection.error == ErrorCode.invalid_replica_assignment
        assert message in rejection.message
    assert validate_target((1, 2, 3), current, state(0, (0, 1, 2)), live) is None
    # Only the replicas being added must be alive: a dead original replica may stay.
    assert validate_target((0, 1, 3), current, state(0, (0, 1)), [0, 1, 3]) is None


def test_starting_bumps_the_leader_epoch_and_keeps_the_leader_and_isr() -> None:
    step = start(
        ReplicaAssignment((0, 1, 2)), state(0, (0, 1, 2)), [1, 2, 3], alive(0, 1, 2, 3), EPOCH
    )
    assert step.assignment == ReplicaAssignment((1, 2, 3, 0), (3,), (0,))
    assert step.state == PartitionState(0, 4, (0, 1, 2), EPOCH, partition_epoch=11)


def test_a_target_already_in_sync_completes_at_once() -> None:
    step = start(ReplicaAssignment((0, 1, 2)), state(0, (0, 1, 2)), [2, 1], alive(0, 1, 2), EPOCH)
    assert step.assignment == ReplicaAssignment((2, 1))
    # The leader is removed: the first live target replica in the ISR leads.
    assert step.state == PartitionState(2, 4, (1, 2), EPOCH, partition_epoch=11)


def test_completing_waits_for_every_target_replica_in_the_isr() -> None:
    moving = ReplicaAssignment((1, 2, 3, 0), (3,), (0,))
    assert complete(moving, state(0, (0, 1, 2)), alive(0, 1, 2, 3), EPOCH) is None
    step = complete(moving, state(0, (0, 1, 2, 3)), alive(0, 1, 2, 3), EPOCH)
    assert step is not None
    assert step.assignment == ReplicaAssignment((1, 2, 3))
    assert step.state == PartitionState(1, 4, (1, 2, 3), EPOCH, partition_epoch=11)


def test_completing_keeps_a_leader_that_stays_and_skips_dead_target_replicas() -> None:
    moving = ReplicaAssignment((3, 1, 2, 0), (3,), (0,))
    kept = complete(moving, state(1, (0, 1, 2, 3)), alive(0, 1, 2, 3), EPOCH)
    assert kept is not None and kept.state.leader == 1 and kept.state.isr == (1, 2, 3)
    moved = complete(moving, state(0, (0, 1, 2, 3)), alive(0, 1, 2), EPOCH)
    assert moved is not None and moved.state.leader == 1  # 3, first in order, is not alive
    assert complete(moving, state(0, (0, 1, 2, 3)), alive(0), EPOCH) is None  # none can lead


def test_cancelling_returns_to_the_original_replicas() -> None:
    moving = ReplicaAssignment((1, 2, 3, 0), (3,), (0,))
    step = start(moving, state(0, (0, 1, 2)), moving.origin, alive(0, 1, 2, 3), EPOCH)
    # Kafka keeps no record of the original order: the move's order remains.
    assert step.assignment == ReplicaAssignment((1, 2, 0))
    assert step.state.leader == 0 and step.state.isr == (0, 1, 2)


def test_a_replaced_move_drops_an_added_replica_from_the_isr_and_leadership() -> None:
    moving = ReplicaAssignment((3, 1, 2, 0), (3,), (0,))
    step = start(moving, state(3, (0, 1, 3)), [4, 1, 2], alive(0, 1, 2, 3, 4), EPOCH)
    assert step.assignment == ReplicaAssignment((4, 1, 2, 0), (4,), (0,))
    assert step.state.leader == 1 and step.state.isr == (0, 1)


def test_a_target_keeping_no_member_of_the_isr_is_refused() -> None:
    # A move's added replica 3 alone is in sync; a new target drops it and the original 0
    # is not in sync: the partition would need an unclean election.
    moving = ReplicaAssignment((3, 0), (3,), (0,))
    rejection = validate_target((4,), moving, state(3, (3,)), [3, 4])
    assert rejection is not None and rejection.error == ErrorCode.invalid_replica_assignment
    assert "unclean leader election" in rejection.message


def test_a_cancel_takes_the_leadership_from_an_added_replica() -> None:
    # [1, 2] -> [3, 4]; 1 died and 3, added by the move, was elected; then the cancel.
    moving = ReplicaAssignment((3, 4, 1, 2), (3, 4), (1, 2))
    step = start(moving, state(3, (2, 3)), moving.origin, alive(2, 3, 4), EPOCH)
    assert step.assignment == ReplicaAssignment((1, 2))
    assert step.state.leader == 2 and step.state.isr == (2,)


def test_the_topic_znode_carries_adding_and_removing_per_partition() -> None:
    topic = TopicAssignment(uuid.uuid4(), {0: (0, 1, 2), 1: (1, 2, 3)})
    moving = with_partition(topic, 0, ReplicaAssignment((1, 2, 3, 0), (3,), (0,)))
    assert moving.partitions == {0: (1, 2, 3, 0), 1: (1, 2, 3)}
    assert moving.adding_replicas == {0: (3,)} and moving.removing_replicas == {0: (0,)}
    assert TopicAssignment.decode(moving.encode()) == moving
    done = with_partition(moving, 0, ReplicaAssignment((1, 2, 3)))
    assert done.adding_replicas == {} and done.removing_replicas == {}
    assert ReplicaAssignment.of(moving, 0).is_being_reassigned
    assert not ReplicaAssignment.of(done, 0).is_being_reassigned


def test_a_move_can_be_cancelled_while_an_original_replica_is_in_sync() -> None:
    moving = ReplicaAssignment((3, 1, 0), (3,), (0,))
    assert validate_cancel(moving, state(0, (0, 1))) is None
    unclean = validate_cancel(moving, state(3, (3,)))
    assert unclean is not None and unclean.error == ErrorCode.invalid_replica_assignment
    none = validate_cancel(ReplicaAssignment((0, 1)), state(0, (0, 1)))
    assert none is not None and none.error == ErrorCode.no_reassignment_in_progress
