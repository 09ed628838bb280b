"""`Reassigner`: the controller's side of partition reassignment, the steps `reassignment`
plans carried out on the metadata store.

It runs inside the controller's event task (never on its own), reads and writes through
the controller (every write fenced by the controller epoch), and keeps the set of
partitions being moved. A watch on the state znode of each one tells when its ISR
changes, so that a move completes once its target replicas are in sync (Kafka's
ZooKeeper-mode controller registers the same watch when brokers do not send AlterPartition).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from tierbroker.broker.controller import reassignment as plan
from tierbroker.broker.controller.context import ControllerContext
from tierbroker.broker.controller.partition_state_machine import PartitionStateMachine
from tierbroker.broker.controller.reassignment import Rejection, ReplicaAssignment
from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.store import (
    CONFLICT_ATTEMPTS,
    BadVersionError,
    NoNodeError,
    SetData,
    Stat,
    WatchEvent,
)
from tierbroker.broker.metadata.zk_data import PartitionState, TopicAssignment
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


class Reassigner:
    def __init__(self, controller: ControllerContext, partitions: PartitionStateMachine) -> None:
        self.controller = controller
        self.partitions = partitions
        self.moving: set[TopicPartition] = set()
        self._watched: set[TopicPartition] = set()  # a watch on its state is armed

    def resume(self) -> None:
        """After the controller read every topic: follow the moves found in progress (Kafka's
        controller resumes them on failover too)."""
        self.moving.clear()
        self._watched.clear()
        for topic, assignment in self.controller.assignments.items():
            for p in {*assignment.adding_replicas, *assignment.removing_replicas}:
                self.check(TopicPartition(topic, p))

    def check(self, tp: TopicPartition) -> None:
        """Look at a move again soon, in the controller's order of events."""
        self.moving.add(tp)
        self.controller.maybe_complete_reassignment(tp)

    def check_all(self) -> None:
        for tp in self.moving:
            self.controller.maybe_complete_reassignment(tp)

    def forget(self, tps: Collection[TopicPartition]) -> None:
        self.moving.difference_update(tps)

    def in_progress(
        self, partitions: Collection[TopicPartition] | None
    ) -> dict[TopicPartition, ReplicaAssignment]:
        """The moves in progress among `partitions` (None: all of them)."""
        found: dict[TopicPartition, ReplicaAssignment] = {}
        for tp in self.moving if partitions is None else partitions:
            topic = self.controller.assignments.get(tp.topic)
            if topic is not None and tp.partition in topic.partitions:
                assignment = ReplicaAssignment.of(topic, tp.partition)
                if assignment.is_being_reassigned:
                    found[tp] = assignment
        return found

    async def reassign(self, tp: TopicPartition, target: Sequence[int] | None) -> Rejection | None:
        """Start moving `tp` to `target`, or cancel its move (None); why not, if refused."""
        ctl = self.controller
        if tp not in self.partitions.states or await ctl.store.exists(zk.delete_path(tp.topic)):
            return Rejection(ErrorCode.unknown_topic_or_partition, "The partition does not exist.")
        for _ in range(CONFLICT_ATTEMPTS):
            try:
                topic, version = await self._read_assignment(tp.topic)
            except NoNodeError:
                return Rejection(
                    ErrorCode.unknown_topic_or_partition, "The partition does not exist."
                )
            current = ReplicaAssignment.of(topic, tp.partition)
            await self.partitions.refresh([tp])
            if target is None:
                rejection = plan.validate_cancel(current, self.partitions.states[tp])
            else:
                live = [b for b in ctl.live_brokers if ctl.is_eligible(b)]
                rejection = plan.validate_target(target, current, self.partitions.states[tp], live)
            if rejection is not None:
                return rejection
            step = plan.start(
                current,
                self.partitions.states[tp],
                current.origin if target is None else target,
                ctl.is_eligible,
                ctl.epoch,
            )
            try:
                await self._write(tp, topic, version, step)
            except BadVersionError:
                continue  # partitions were added, or the ISR changed: decide again
            log.info(
                "controller: %s %s: replicas %s, adding %s, removing %s",
                "cancelling the move of" if target is None else "moving",
                tp,
                list(current.replicas),
                list(step.assignment.adding),
                list(step.assignment.removing),
            )
            return None
        return Rejection(
            ErrorCode.request_timed_out, "The partition's state kept changing; try again."
        )

    async def on_isr_change(self, tp: TopicPartition) -> None:
        """A partition being moved may complete: its ISR changed, or a broker came back."""
        if tp not in self.moving:
            return
        ctl = self.controller
        watch = None if tp in self._watched else self._watch(tp)
        try:
            data, stat = await ctl.store.get(zk.state_path(tp.topic, tp.partition), watch)
            # Armed only once the read succeeded: a retried event arms it again otherwise.
            self._watched.add(tp)
            topic, version = await self._read_assignment(tp.topic)
        except NoNodeError:
            self.moving.discard(tp)  # deleted
            self._watched.discard(tp)
            return
        state = self.partitions.states[tp] = PartitionState.decode(data, stat.version)
        step = plan.complete(
            ReplicaAssignment.of(topic, tp.partition), state, ctl.is_eligible, ctl.epoch
        )
        if step is None:
            return
        try:
            await self._write(tp, topic, version, step)
        except BadVersionError:
            self.check(tp)  # changed meanwhile: look again
            return
        log.info("controller: %s moved to %s", tp, list(step.assignment.replicas))

    def _watch(self, tp: TopicPartition) -> Callable[[WatchEvent, str], None]:
        def fired(_event: WatchEvent, _path: str) -> None:
            self._watched.discard(tp)
            self.controller.maybe_complete_reassignment(tp)

        return fired

    async def _read_assignment(self, topic: str) -> tuple[TopicAssignment, int]:
        data, stat = await self.controller.store.get(zk.topic_path(topic))
        return TopicAssignment.decode(data), stat.version

    async def _write(
        self, tp: TopicPartition, topic: TopicAssignment, version: int, step: plan.Step
    ) -> None:
        """Write a partition's assignment and state together; raises BadVersionError if
        either changed since read."""
        ctl = self.controller
        updated = plan.with_partition(topic, tp.partition, step.assignment)
        results = await ctl.write(
            [
                SetData(zk.topic_path(tp.topic), updated.encode(), version),
                SetData(
                    zk.state_path(tp.topic, tp.partition),
                    step.state.encode(),
                    step.state.partition_epoch,
                ),
            ]
        )
        written = results[2]
        assert isinstance(written, Stat)
        ctl.assignments[tp.topic] = updated
        self.partitions.states[tp] = replace(step.state, partition_epoch=written.version)
        if step.assignment.is_being_reassigned:
            self.check(tp)  # arms the watch on its state
        else:
            self.moving.discard(tp)
