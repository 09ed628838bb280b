"""`PartitionStateMachine`: the controller's view of every partition's state (leader,
leader epoch, ISR) and the decisions and writes that change it, as Kafka's ZooKeeper-mode
PartitionStateMachine.

- a new partition gets its first state: the first live replica of its assignment leads,
  the live replicas are the ISR, leader epoch 0;
- a partition whose leader died, or is shutting down, gets a new leader from its live ISR
  (the first in assignment order) and a new leader epoch; without one it stays leaderless
  (`unclean.leader.election.enable` lets any live replica lead, losing what only the ISR
  had); a dead or shutting-down follower leaves the ISR, except the last.

Every write goes through the controller (fenced by the controller epoch) and is
conditional on the version of the state it replaces (the partition epoch): a leader that
changed its ISR meanwhile makes the controller read the state again and decide again. Used
only from the controller's event task.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

from tierbroker.broker.controller.context import ControllerContext
from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.store import (
    CONFLICT_ATTEMPTS,
    OPS_PER_MULTI,
    BadVersionError,
    Create,
    NodeExistsError,
    NoNodeError,
    Op,
    SetData,
    Stat,
    gather_bounded,
)
from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


class PartitionStateMachine:
    def __init__(self, controller: ControllerContext) -> None:
        self.controller = controller
        self.states: dict[TopicPartition, PartitionState] = {}

    def without(
        self, tp: TopicPartition, state: PartitionState, brokers: set[int]
    ) -> PartitionState:
        """`state` with `brokers` out of leadership and the ISR (keeping the last ISR member)."""
        ctl = self.controller
        isr = tuple(b for b in state.isr if b not in brokers) or state.isr[-1:]
        if state.leader not in brokers:
            return replace(state, isr=isr, controller_epoch=ctl.epoch)
        candidates = [
            b for b in ctl.replicas(tp) if b in isr and ctl.is_eligible(b) and b not in brokers
        ]
        if candidates:
            return PartitionState(
                candidates[0], state.leader_epoch + 1, isr, ctl.epoch, state.partition_epoch
            )
        return PartitionState(
            zk.NO_LEADER, state.leader_epoch + 1, isr, ctl.epoch, state.partition_epoch
        )

    async def elect_offline(self, among: Iterable[TopicPartition]) -> None:
        """Lead every leaderless partition (or one led by a broker gone) that can be led."""
        ctl = self.controller
        changes: dict[TopicPartition, PartitionState] = {}
        for tp in list(among):
            state = self.states.get(tp)
            if state is None or ctl.is_eligible(state.leader) or tp.topic not in ctl.assignments:
                continue
            elected = self.offline_election(tp, state)
            if elected is not None:
                changes[tp] = elected
        await self.apply(changes)

    def offline_election(self, tp: TopicPartition, state: PartitionState) -> PartitionState | None:
        ctl = self.controller
        replicas = ctl.replicas(tp)
        live_isr = [b for b in replicas if b in state.isr and ctl.is_eligible(b)]
        if live_isr:
            isr = tuple(b for b in state.isr if ctl.is_eligible(b))
            return PartitionState(
                live_isr[0], state.leader_epoch + 1, isr, ctl.epoch, state.partition_epoch
            )
        if ctl.unclean_election_enabled(tp.topic):
            live = [b for b in replicas if ctl.is_eligible(b)]
            if live:
                log.warning(
                    "controller: unclean election of %d for %s: records only ISR %s held are lost",
                    live[0],
                    tp,
                    list(state.isr),
                )
                return PartitionState(
                    live[0], state.leader_epoch + 1, (live[0],), ctl.epoch, state.partition_epoch
                )
        if state.leader != zk.NO_LEADER:
            return PartitionState(
                zk.NO_LEADER, state.leader_epoch + 1, state.isr, ctl.epoch, state.partition_epoch
            )
        return None

    async def create(self, tps: list[TopicPartition]) -> set[str]:
        """First states of new partitions: the first live replica leads, live replicas are the
        ISR (Kafka's NewPartition -> OnlinePartition), in the topic's first leader epoch (0
        but for a restored topic). Returns the topics to read again: a
        state was created meanwhile by an earlier controller, or the topic was deleted."""
        ctl = self.controller
        reread: set[str] = set()
        for start in range(0, len(tps), OPS_PER_MULTI // 3):
            ops: list[Op] = []
            created: dict[TopicPartition, PartitionState] = {}
            for tp in tps[start : start + OPS_PER_MULTI // 3]:
                live = [b for b in ctl.replicas(tp) if ctl.is_eligible(b)]
                topic = ctl.assignments.get(tp.topic)
                first_epoch = topic.first_leader_epoch if topic else 0
                state = PartitionState(
                    live[0] if live else zk.NO_LEADER, first_epoch, tuple(live), ctl.epoch, 0
                )
                if not await ctl.store.exists(zk.partitions_path(tp.topic)):
                    try:
                        await ctl.write([Create(zk.partitions_path(tp.topic))])
                    except NodeExistsError:
                        pass
                ops += [
                    Create(zk.partition_path(tp.topic, tp.partition)),
                    Create(zk.state_path(tp.topic, tp.partition), state.encode()),
                ]
                created[tp] = state
            try:
                await ctl.write(ops)
            except (NodeExistsError, NoNodeError):
                reread.update(tp.topic for tp in created)
                continue
            self.states.update(created)
        return reread

    async def refresh(self, tps: Iterable[TopicPartition]) -> None:
        """Read again the states of partitions about to be decided on: their leaders change
        their ISRs without this controller (Kafka's controller learns of it through ISR
        change notifications; reading before deciding needs no more znodes)."""
        await gather_bounded(self._refresh_one(tp) for tp in list(tps) if tp in self.states)

    async def _refresh_one(self, tp: TopicPartition) -> None:
        try:
            data, stat = await self.controller.store.get(zk.state_path(tp.topic, tp.partition))
        except NoNodeError:
            return  # being deleted: the deletion event forgets it
        self.states[tp] = PartitionState.decode(data, stat.version)

    def hosted_on(self, brokers: set[int]) -> list[TopicPartition]:
        return [tp for tp in self.states if brokers & set(self.controller.replicas(tp))]

    async def apply(self, changes: dict[TopicPartition, PartitionState]) -> None:
        """Write new partition states, each conditional on the version it replaces; a state
        changed meanwhile (a leader's ISR write) is read again and decided again."""
        items = [(tp, s) for tp, s in changes.items() if s != self.states.get(tp)]
        moved = sum(1 for tp, s in items if s.leader != self._leader_of(tp))
        if moved:
            log.info("controller: %d partitions get a new leader", moved)
        for start in range(0, len(items), OPS_PER_MULTI - 1):
            chunk = items[start : start + OPS_PER_MULTI - 1]
            ops: list[Op] = [
                SetData(zk.state_path(tp.topic, tp.partition), s.encode(), s.partition_epoch)
                for tp, s in chunk
            ]
            try:
                results = await self.controller.write(ops)
            except (BadVersionError, NoNodeError):
                for tp, s in chunk:
                    await self._write_state_alone(tp, s)
                continue
            for (tp, s), stat in zip(chunk, results[1:], strict=True):
                assert stat is not None and not isinstance(stat, str)
                self.states[tp] = replace(s, partition_epoch=stat.version)

    def _leader_of(self, tp: TopicPartition) -> int:
        state = self.states.get(tp)
        return state.leader if state is not None else zk.NO_LEADER

    async def _write_state_alone(self, tp: TopicPartition, state: PartitionState) -> None:
        ctl = self.controller
        path = zk.state_path(tp.topic, tp.partition)
        for _ in range(CONFLICT_ATTEMPTS):
            try:
                results = await ctl.write([SetData(path, state.encode(), state.partition_epoch)])
            except NoNodeError:
                self.states.pop(tp, None)
                return
            except BadVersionError:
                data, stat = await ctl.store.get(path)
                current = PartitionState.decode(data, stat.version)
                self.states[tp] = current
                state = self._decide_again(tp, current, state)
                if state == current:
                    return
                continue
            written = results[1]
            assert isinstance(written, Stat)
            self.states[tp] = replace(state, partition_epoch=written.version)
            return
        log.warning("controller: gave up changing %s after repeated conflicts", tp)

    def _decide_again(
        self, tp: TopicPartition, current: PartitionState, wanted: PartitionState
    ) -> PartitionState:
        """What to write over `current`, a state a leader changed after the decision."""
        ctl = self.controller
        gone = {b for b in current.isr if not ctl.is_eligible(b)}
        if current.leader != wanted.leader and not ctl.is_eligible(current.leader):
            gone.add(current.leader)
        if not gone and ctl.is_eligible(current.leader):
            return current
        decided = self.without(tp, current, gone)
        if decided.leader == zk.NO_LEADER:
            return self.offline_election(tp, decided) or decided
        return decided
