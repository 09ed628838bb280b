"""Leader elections an operator asks for (Kafka's ElectLeaders API) and the ones the
controller makes to keep leadership where the assignments put it
(`auto.leader.rebalance.enable`).

PREFERRED moves a partition's leadership to its preferred replica, the first of its
assignment, when that replica is alive and in the ISR. UNCLEAN gives a partition whose
leader is gone a leader from its live ISR or, failing that, any live replica, losing
what only the old ISR held. Each outcome carries the error Kafka answers with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum

from tierbroker.broker.metadata.zk_data import NO_LEADER, PartitionState
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition


class ElectionType(IntEnum):
    PREFERRED = 0
    UNCLEAN = 1


@dataclass(frozen=True, slots=True)
class LeaderBalance:
    """`auto.leader.rebalance.enable` and how it checks (Kafka's names and defaults)."""

    enabled: bool = True
    check_interval_s: float = 300.0  # leader.imbalance.check.interval.seconds
    per_broker_percentage: int = 10  # leader.imbalance.per.broker.percentage


@dataclass(frozen=True, slots=True)
class Election:
    """The outcome for one partition: the state to write (None: nothing to write)."""

    error: ErrorCode
    state: PartitionState | None = None
    message: str | None = None


def elect(
    election_type: ElectionType,
    replicas: Sequence[int],
    state: PartitionState,
    is_eligible: Callable[[int], bool],
    controller_epoch: int,
) -> Election:
    if election_type == ElectionType.PREFERRED:
        return _preferred(replicas, state, is_eligible, controller_epoch)
    return _unclean(replicas, state, is_eligible, controller_epoch)


def _preferred(
    replicas: Sequence[int],
    state: PartitionState,
    is_eligible: Callable[[int], bool],
    controller_epoch: int,
) -> Election:
    preferred = replicas[0]
    if state.leader == preferred:
        return Election(ErrorCode.election_not_needed, message="the preferred replica leads")
    if not is_eligible(preferred) or preferred not in state.isr:
        return Election(
            ErrorCode.preferred_leader_not_available,
            message=f"preferred replica {preferred} is not alive or not in the ISR",
        )
    return Election(ErrorCode.none, _led_by(preferred, state, state.isr, controller_epoch))


def _unclean(
    replicas: Sequence[int],
    state: PartitionState,
    is_eligible: Callable[[int], bool],
    controller_epoch: int,
) -> Election:
    if state.leader != NO_LEADER and is_eligible(state.leader):
        return Election(ErrorCode.election_not_needed, message="the partition has a leader")
    live_isr = [b for b in replicas if b in state.isr and is_eligible(b)]
    if live_isr:
        isr = tuple(b for b in state.isr if is_eligible(b))
        return Election(ErrorCode.none, _led_by(live_isr[0], state, isr, controller_epoch))
    live = [b for b in replicas if is_eligible(b)]
    if not live:
        return Election(ErrorCode.eligible_leaders_not_available, message="no replica is alive")
    return Election(ErrorCode.none, _led_by(live[0], state, (live[0],), controller_epoch))


def _led_by(
    leader: int, state: PartitionState, isr: tuple[int, ...], controller_epoch: int
) -> PartitionState:
    return replace(
        state,
        leader=leader,
        leader_epoch=state.leader_epoch + 1,
        isr=isr,
        controller_epoch=controller_epoch,
    )


def imbalanced_partitions(
    replicas: Mapping[TopicPartition, Sequence[int]],
    states: Mapping[TopicPartition, PartitionState],
    is_eligible: Callable[[int], bool],
    imbalance_percentage: int,
) -> list[TopicPartition]:
    """Partitions to give back to their preferred replica, as Kafka's controller picks
    them: for each live broker, the partitions it is preferred for but does not lead, once
    they are more than `imbalance_percentage` of those it is preferred for. (A preferred
    election then checks that the broker is in each one's ISR.)"""
    by_preferred: dict[int, list[TopicPartition]] = {}
    for tp, assigned in replicas.items():
        if assigned and tp in states:
            by_preferred.setdefault(assigned[0], []).append(tp)
    chosen: list[TopicPartition] = []
    for broker, preferred_here in sorted(by_preferred.items()):
        elsewhere = [tp for tp in preferred_here if states[tp].leader != broker]
        if len(elsewhere) * 100 <= imbalance_percentage * len(preferred_here):
            continue
        if is_eligible(broker):
            chosen += elsewhere
    return chosen
