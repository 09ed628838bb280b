"""Partition reassignment (Kafka's AlterPartitionReassignments), decided as Kafka's
controller decides it; the controller writes what these functions plan.

A partition being reassigned has, in its topic znode, replicas RS = target + original
(in that order, without repeats), `adding_replicas` AR = RS - original and
`removing_replicas` RR = RS - target. The steps, each one write of the topic znode and
the partition state together:

- start: RS, AR, RR are written and the leader epoch is bumped, so every replica (the
  new ones too) follows the new assignment; the new replicas fetch from the leader,
  which puts them in the ISR once they have caught up;
- complete, once every target replica is in the ISR: the assignment becomes the target,
  the removed replicas leave the ISR (their brokers, no longer assigned, delete their
  logs: Kafka's StopReplica with delete), and a leader that is removed, or not alive,
  hands over to the first live target replica in the ISR;
- cancel (a null target): back to the original replicas at once, those in the ISR
  staying in it, and the added replicas dropped; refused while no original replica is
  in the ISR (going back would be an unclean election).

A reassignment that replaces one in progress keeps the original replicas of the first
one: what was added and is no longer wanted is dropped at once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from tierbroker.broker.metadata.zk_data import NO_LEADER, PartitionState, TopicAssignment
from tierbroker.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    """A partition's replicas, with those being added and removed (Kafka's names)."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def origin(self) -> tuple[int, ...]:
        return tuple(b for b in self.replicas if b not in self.adding)

    @property
    def target(self) -> tuple[int, ...]:
        return tuple(b for b in self.replicas if b not in self.removing)

    @property
    def is_being_reassigned(self) -> bool:
        return bool(self.adding or self.removing)

    def reassign_to(self, target: Sequence[int]) -> ReplicaAssignment:
        """The assignment while moving from the original replicas to `target`."""
        origin = self.origin
        full = tuple(dict.fromkeys((*target, *origin)))
        return ReplicaAssignment(
            full,
            tuple(b for b in full if b not in origin),
            tuple(b for b in full if b not in target),
        )

    @classmethod
    def of(cls, topic: TopicAssignment, partition: int) -> ReplicaAssignment:
        return cls(
            topic.partitions[partition],
            topic.adding_replicas.get(partition, ()),
            topic.removing_replicas.get(partition, ()),
        )


def with_partition(
    topic: TopicAssignment, partition: int, assignment: ReplicaAssignment
) -> TopicAssignment:
    """`topic` with `partition` assigned as `assignment`."""
    adding = {p: r for p, r in topic.adding_replicas.items() if p != partition}
    removing = {p: r for p, r in topic.removing_replicas.items() if p != partition}
    if assignment.adding:
        adding[partition] = assignment.adding
    if assignment.removing:
        removing[partition] = assignment.removing
    partitions = {**topic.partitions, partition: assignment.replicas}
    return TopicAssignment(topic.topic_id, partitions, adding, removing)


@dataclass(frozen=True, slots=True)
class Rejection:
    error: ErrorCode
    message: str


def validate_target(
    target: Sequence[int],
    current: ReplicaAssignment,
    state: PartitionState,
    live_brokers: Collection[int],
) -> Rejection | None:
    """Kafka's checks of a target replica list: not empty, no repeats, valid ids, and
    every replica to add on a live broker; and, as a cancel, a member of the ISR among
    the replicas during the reassignment (otherwise it would need an unclean election)."""
    if not target:
        return Rejection(
            ErrorCode.invalid_replica_assignment,
            "Empty replica list specified in partition reassignment.",
        )
    if len(set(target)) != len(target):
        return Rejection(
            ErrorCode.invalid_replica_assignment,
            f"Duplicate replica ids in partition reassignment replica list: {list(target)}",
        )
    if any(b < 0 for b in target):
        return Rejection(
            ErrorCode.invalid_replica_assignment, f"Invalid broker id in replica list: {target}"
        )
    reassigning = current.reassign_to(target)
    if not set(reassigning.adding) <= set(live_brokers):
        return Rejection(
            ErrorCode.invalid_replica_assignment,
            "Replica assignment has brokers that are not alive. Replica list: "
            f"{list(reassigning.adding)}, live broker list: {sorted(live_brokers)}",
        )
    if not set(state.isr) & set(reassigning.replicas):
        return Rejection(
            ErrorCode.invalid_replica_assignment,
            f"No replica of the ISR {list(state.isr)} is among {list(reassigning.replicas)}, "
            "so the reassignment would require an unclean leader election.",
        )
    return None


def validate_cancel(current: ReplicaAssignment, state: PartitionState) -> Rejection | None:
    """A move can be cancelled while it is in progress and an original replica is in the
    ISR (otherwise going back would be an unclean election, which KRaft refuses too)."""
    if not current.is_being_reassigned:
        return Rejection(ErrorCode.no_reassignment_in_progress, "No reassignment in progress.")
    if not set(state.isr) & set(current.origin):
        return Rejection(
            ErrorCode.invalid_replica_assignment,
            "Unable to revert the partition assignment: no original replica is in the ISR, "
            "so it would require an unclean leader election.",
        )
    return None


@dataclass(frozen=True, slots=True)
class Step:
    """What to write for one partition: its assignment and its state."""

    assignment: ReplicaAssignment
    state: PartitionState


def start(
    current: ReplicaAssignment,
    state: PartitionState,
    target: Sequence[int],
    is_eligible: Callable[[int], bool],
    controller_epoch: int,
) -> Step:
    """The first step towards `target` (the last one too if it can complete at once)."""
    moving = current.reassign_to(target)
    done = complete(moving, state, is_eligible, controller_epoch)
    if done is not None:
        return done
    # Replicas added by a reassignment this one replaces, and no longer wanted, leave now
    # (`validate_target` keeps one in the ISR).
    isr = tuple(b for b in state.isr if b in moving.replicas)
    leader = state.leader
    if leader not in moving.replicas:
        leader = _first_leader(moving.replicas, isr, is_eligible)
    bumped = PartitionState(
        leader, state.leader_epoch + 1, isr, controller_epoch, state.partition_epoch
    )
    return Step(moving, bumped)


def complete(
    moving: ReplicaAssignment,
    state: PartitionState,
    is_eligible: Callable[[int], bool],
    controller_epoch: int,
) -> Step | None:
    """The last step: the assignment becomes the target. None while a target replica is
    not in the ISR, or while no target replica can lead."""
    target = moving.target
    leader = state.leader
    if moving.is_being_reassigned and not set(target) <= set(state.isr):
        return None
    # A cancel too: the leader may be a replica it drops, elected while the move ran.
    if leader not in target or not is_eligible(leader):
        leader = _first_leader(target, state.isr, is_eligible)
        if leader == NO_LEADER:
            return None
    isr = tuple(b for b in state.isr if b in target)
    finished = replace(
        state,
        leader=leader,
        leader_epoch=state.leader_epoch + 1,
        isr=isr,
        controller_epoch=controller_epoch,
    )
    return Step(ReplicaAssignment(target), finished)


def _first_leader(
    replicas: Sequence[int], isr: Collection[int], is_eligible: Callable[[int], bool]
) -> int:
    """Kafka's reassignment election: the first live replica, in order, that is in the ISR."""
    return next((b for b in replicas if b in isr and is_eligible(b)), NO_LEADER)
