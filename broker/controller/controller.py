"""`Controller`: the one broker that elects partition leaders, as Kafka's ZooKeeper-mode controller.

Every broker runs one; the first to create the ephemeral `/controller` (together with
bumping `/controller_epoch`, in one multi) is active until its session ends. The active
controller watches the live brokers, the topics, deletion requests and controlled-shutdown
requests, and handles each change as an event, one at a time, in its own task:

- a new partition gets its first state; a partition whose leader died, or is shutting
  down, a new leader; a dead or shutting-down follower leaves the ISR (the decisions and
  writes are `partition_state_machine`'s);
- a leaderless partition whose ISR member returns is led by it again;
- a deleted topic's znodes are removed (brokers delete the logs when they see it gone);
- an ElectLeaders request, or the periodic leader-balance check, moves leadership back
  to preferred replicas (see `leader_election`);
- an AlterPartitionReassignments request starts (or cancels) moving a partition to other
  replicas; a watch on the state of each partition being moved tells when its new
  replicas are in the ISR, and the move completes (see `reassignment`).

Every write goes in a multi with a check of `/controller_epoch`'s version: a controller
that was replaced (its session expired) cannot change anything, and resigns when it
finds out.

An event that fails unexpectedly (a znode another tool wrote, a topic deleted meanwhile)
is logged and answered NOT_CONTROLLER, and the next event is handled, as in Kafka's
ControllerEventManager. After `MAX_EVENT_FAILURES` failures in a row the view is taken
as broken: the controller resigns (drops `/controller`), and the next term, here or on
another broker, reloads the state. However the event task ends, every caller waiting on
it gets NOT_CONTROLLER.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from tierbroker.broker.controller.leader_election import (
    Election,
    ElectionType,
    LeaderBalance,
    elect,
    imbalanced_partitions,
)
from tierbroker.broker.controller.partition_state_machine import PartitionStateMachine
from tierbroker.broker.controller.reassigner import Reassigner
from tierbroker.broker.controller.reassignment import Rejection, ReplicaAssignment
from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.store import (
    OPS_PER_MULTI,
    BadVersionError,
    Check,
    ConnectionLossError,
    Create,
    Delete,
    MetadataStore,
    MultiError,
    NodeExistsError,
    NoNodeError,
    Op,
    SessionExpiredError,
    SessionState,
    SetData,
    Stat,
    StoreError,
    WatchEvent,
)
from tierbroker.broker.metadata.zk_data import PartitionState, TopicAssignment
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.long_lived import freeze_long_lived
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

# Events failing unexpectedly in a row before the controller resigns for a fresh term.
MAX_EVENT_FAILURES = 3


class ControllerMoved(Exception):
    """Another broker became controller: this one must not write."""


class NotController(Exception):
    """This broker is not the active controller (Kafka's NOT_CONTROLLER)."""


@dataclass(frozen=True, slots=True)
class _ElectionRequest:
    election_type: ElectionType
    partitions: Collection[TopicPartition] | None  # None: every partition
    outcome: asyncio.Future[dict[TopicPartition, Election]] = field(compare=False)


@dataclass(frozen=True, slots=True)
class _ReassignRequest:
    targets: Mapping[TopicPartition, Sequence[int] | None]  # None: cancel
    outcome: asyncio.Future[dict[TopicPartition, Rejection | None]] = field(compare=False)


@dataclass(frozen=True, slots=True)
class _Event:
    # "startup", "brokers", "topics", "topic", "deletions", "shutdowns", "elect", "balance",
    # "reassign", "reassignment_isr_change" (the ISR of `topic`'s `partition`, being
    # reassigned, changed)
    kind: str
    topic: str = ""
    election: _ElectionRequest | None = None
    reassignment: _ReassignRequest | None = None
    partition: int = -1


class Controller:
    def __init__(
        self,
        broker_id: int,
        store: MetadataStore,
        unclean_election_enabled: Callable[[str], bool] = lambda _topic: False,
        leader_balance: LeaderBalance | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.store = store
        self.unclean_election_enabled = unclean_election_enabled
        self.leader_balance = leader_balance or LeaderBalance()
        self.epoch = 0
        self._epoch_version = -1
        self._active = False
        self._events: asyncio.Queue[_Event] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._balance_task: asyncio.Task[None] | None = None
        self._electing: asyncio.Task[None] | None = None
        self._stopped = False
        # The active controller's view, read at election and kept up to date by its events.
        self.live_brokers: dict[int, int] = {}  # id -> broker epoch
        self.assignments: dict[str, TopicAssignment] = {}
        self.partition_states = PartitionStateMachine(self)
        self.shutting_down: set[int] = set()
        self.reassigner = Reassigner(self, self.partition_states)

    @property
    def is_active(self) -> bool:
        return self._active

    @property
    def states(self) -> dict[TopicPartition, PartitionState]:
        return self.partition_states.states

    async def start(self) -> None:
        self.store.add_state_listener(self._on_session_state)
        await self._try_to_elect()

    async def stop(self) -> None:
        """Stop acting; resign (delete `/controller`) if active. Idempotent."""
        self._stopped = True
        for task in (self._task, self._balance_task, self._electing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._active:
            self._active = False
            try:
                await self.store.delete(zk.CONTROLLER)
            except StoreError as e:
                log.info("controller %d: could not resign cleanly: %s", self.broker_id, e)

    # Election ------------------------------------------------------------------------

    def _on_session_state(self, state: SessionState) -> None:
        if state == SessionState.LOST and self._active:
            log.warning("controller %d: session lost, resigning", self.broker_id)
            self._resign()
        if state == SessionState.CONNECTED and not self._active:
            self._elect_soon()

    def _on_controller_change(self, event: WatchEvent, _path: str) -> None:
        if event == WatchEvent.DELETED or not self._active:
            self._elect_soon()

    def _elect_soon(self) -> None:
        if self._stopped or (self._electing is not None and not self._electing.done()):
            return
        self._electing = asyncio.get_running_loop().create_task(
            self._try_to_elect(), name=f"controller-{self.broker_id}-election"
        )

    async def _try_to_elect(self) -> None:
        try:
            await self._elect()
        except (ConnectionLossError, SessionExpiredError) as e:
            log.info("controller %d: election postponed: %s", self.broker_id, e)

    async def _elect(self) -> None:
        watch = self._on_controller_change
        if await self.store.exists(zk.CONTROLLER, watch) is not None:
            return  # someone leads; the watch tells when that ends
        try:
            data, stat = await self.store.get(zk.CONTROLLER_EPOCH)
            epoch, version = int(data), stat.version
        except NoNodeError:
            epoch, version = 0, -1
        new_epoch = epoch + 1
        claim: list[Op] = [Create(zk.CONTROLLER, zk.encode_controller(self.broker_id), True)]
        if version < 0:
            claim.append(Create(zk.CONTROLLER_EPOCH, str(new_epoch).encode()))
        else:
            claim.append(SetData(zk.CONTROLLER_EPOCH, str(new_epoch).encode(), version))
        try:
            await self.store.multi(claim)
        except MultiError as e:
            if not isinstance(e.error, NodeExistsError | BadVersionError):
                raise e.error from e
            await self.store.exists(zk.CONTROLLER, watch)  # another won: watch it
            return
        _, stat = await self.store.get(zk.CONTROLLER_EPOCH)
        await self.store.exists(zk.CONTROLLER, watch)
        if self._stopped:
            return  # stopped while electing: /controller goes with the session
        self.epoch, self._epoch_version = new_epoch, stat.version
        self._active = True
        log.info("broker %d is the controller (epoch %d)", self.broker_id, self.epoch)
        for task in (self._task, self._balance_task):
            if task is not None:
                task.cancel()  # a run of an earlier term, ended by ControllerMoved
        self._events = asyncio.Queue()
        self._events.put_nowait(_Event("startup"))
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(
            self._process_events(self._events), name=f"controller-{self.broker_id}"
        )
        if self.leader_balance.enabled:
            self._balance_task = loop.create_task(
                self._check_balance_periodically(), name=f"controller-{self.broker_id}-balance"
            )

    def _resign(self) -> None:
        self._active = False
        for task in (self._task, self._balance_task):
            if task is not None:
                task.cancel()  # an election it was running is answered by its timeout
        self._task = self._balance_task = None  # their waiters are failed as they end

    # Events --------------------------------------------------------------------------

    def _watch(self, kind: str, topic: str = "") -> Callable[[WatchEvent, str], None]:
        def fired(_event: WatchEvent, _path: str) -> None:
            if self._active:
                self._events.put_nowait(_Event(kind, topic))

        return fired

    async def _process_events(self, events: asyncio.Queue[_Event]) -> None:
        current: _Event | None = None
        failures = 0
        try:
            while True:
                current = await events.get()
                try:
                    await self._handle(current)
                    failures = 0
                except ControllerMoved:
                    log.warning(
                        "controller %d: a newer controller exists; resigning", self.broker_id
                    )
                    self._active = False
                    self._elect_soon()
                    return
                except SessionExpiredError:
                    log.warning("controller %d: session expired; resigning", self.broker_id)
                    self._active = False
                    return
                except ConnectionLossError as e:
                    # Disconnected, perhaps briefly: try again (a lost session ends as above).
                    log.info(
                        "controller %d: %s while handling %s; retrying", self.broker_id, e, current
                    )
                    await asyncio.sleep(0.2)
                    events.put_nowait(current)
                except Exception:
                    failures += 1
                    log.exception(
                        "controller %d: handling %s failed (%d in a row)",
                        self.broker_id,
                        current.kind,
                        failures,
                    )
                    _fail_waiters(current)
                    if failures >= MAX_EVENT_FAILURES:
                        await self._resign_for_a_fresh_term()
                        return
                current = None
        finally:
            # However the task ends, no caller waits on it forever.
            _fail_waiters(current)
            while not events.empty():
                _fail_waiters(events.get_nowait())

    async def _resign_for_a_fresh_term(self) -> None:
        """Drop `/controller` (fenced by the epoch): its watch starts the next election,
        whose startup reads the whole state again."""
        log.error(
            "controller %d: %d events failed in a row; resigning",
            self.broker_id,
            MAX_EVENT_FAILURES,
        )
        self._active = False
        self._task = None  # this task, ending
        if self._balance_task is not None:
            self._balance_task.cancel()
            self._balance_task = None
        try:
            await self.store.multi(
                [Check(zk.CONTROLLER_EPOCH, self._epoch_version), Delete(zk.CONTROLLER)]
            )
        except StoreError as e:
            log.warning("controller %d: could not resign cleanly: %s", self.broker_id, e)
            self._elect_soon()

    async def _handle(self, event: _Event) -> None:
        if event.kind == "startup":
            await self._on_startup()
        elif event.kind == "brokers":
            await self._on_brokers_change()
        elif event.kind == "topics":
            await self._on_topics_change()
        elif event.kind == "topic":
            await self._on_topic_change(event.topic)
        elif event.kind == "deletions":
            await self._on_deletions()
        elif event.kind == "shutdowns":
            await self._on_shutdowns()
        elif event.kind == "elect":
            assert event.election is not None
            await self._on_election(event.election)
        elif event.kind == "balance":
            await self._on_balance_check()
        elif event.kind == "reassign":
            assert event.reassignment is not None
            await self._on_reassign(event.reassignment)
        elif event.kind == "reassignment_isr_change":
            await self.reassigner.on_isr_change(TopicPartition(event.topic, event.partition))

    async def _on_startup(self) -> None:
        self.assignments.clear()
        self.states.clear()
        await self._read_brokers()
        await self._on_shutdowns()
        await self._on_topics_change()
        await self._on_deletions()
        # What was just read lives for this term: a full collection during the elections
        # below would walk it all (50 ms for 1,000 partitions).
        freeze_long_lived()
        # As Kafka's controller does on failover: replicas on brokers that are not live
        # go offline, out of every ISR (a broker may have died with the old controller).
        await self._on_brokers_gone(
            {b for state in self.states.values() for b in state.isr} - set(self.live_brokers)
        )
        await self.partition_states.elect_offline(self.states)
        self.reassigner.resume()

    async def _read_brokers(self) -> tuple[set[int], set[int]]:
        """Refresh the live brokers; (brokers that appeared or restarted, brokers gone)."""
        ids = await self.store.children(zk.BROKER_IDS, self._watch("brokers"))
        live: dict[int, int] = {}
        for name in ids:
            stat = await self.store.exists(zk.broker_path(int(name)))
            if stat is not None:
                live[int(name)] = stat.czxid
        started = {b for b, e in live.items() if self.live_brokers.get(b) != e}
        gone = {b for b, e in self.live_brokers.items() if live.get(b) != e}
        self.live_brokers = live
        return started, gone

    async def _on_brokers_change(self) -> None:
        started, gone = await self._read_brokers()
        if not started and not gone:
            return
        log.info(
            "controller: brokers %s started, %s gone; live %s",
            sorted(started),
            sorted(gone),
            sorted(self.live_brokers),
        )
        # A broker that restarted (a new broker epoch) lost what it held in memory: it is
        # handled as gone, then as started (as Kafka's controller handles a bounced broker).
        await self._on_brokers_gone(gone)
        await self.partition_states.elect_offline(self.states)
        self.reassigner.check_all()  # a move may wait for a target replica to lead

    async def _on_brokers_gone(self, gone: set[int]) -> None:
        if not gone:
            return
        await self.partition_states.refresh(self.partition_states.hosted_on(gone))
        changes: dict[TopicPartition, PartitionState] = {}
        for tp, state in self.states.items():
            if state.leader in gone or gone & set(state.isr):
                changes[tp] = self.partition_states.without(tp, state, gone)
        await self.partition_states.apply(changes)

    def is_eligible(self, broker: int) -> bool:
        return broker in self.live_brokers and broker not in self.shutting_down

    def replicas(self, tp: TopicPartition) -> tuple[int, ...]:
        assignment = self.assignments.get(tp.topic)
        return assignment.partitions.get(tp.partition, ()) if assignment else ()

    async def _on_topics_change(self) -> None:
        names = set(await self.store.children(zk.TOPICS, self._watch("topics")))
        for gone in set(self.assignments) - names:
            self._forget(gone)
        for name in sorted(names - set(self.assignments)):
            await self._on_topic_change(name)

    def _forget(self, topic: str) -> None:
        assignment = self.assignments.pop(topic, None)
        if assignment is not None:
            for p in assignment.partitions:
                self.states.pop(TopicPartition(topic, p), None)
            self.reassigner.forget([TopicPartition(topic, p) for p in assignment.partitions])

    async def _on_topic_change(self, topic: str) -> None:
        """A topic appeared or got partitions: read it, and elect its new partitions."""
        try:
            data, _ = await self.store.get(zk.topic_path(topic), self._watch("topic", topic))
        except NoNodeError:
            self._forget(topic)
            return
        try:
            assignment = TopicAssignment.decode(data)
        except zk.UNDECODABLE as e:
            # Not written by a broker: skipped until it changes (its watch is set).
            log.error("controller: topic znode of %r does not decode: %r", topic, e)
            return
        known = self.assignments.get(topic)
        if known is not None and known.topic_id != assignment.topic_id:
            self._forget(topic)
        self.assignments[topic] = assignment
        new: list[TopicPartition] = []
        for p in sorted(assignment.partitions):
            tp = TopicPartition(topic, p)
            if tp in self.states:
                continue
            try:
                data, stat = await self.store.get(zk.state_path(topic, p))
                self.states[tp] = PartitionState.decode(data, stat.version)
            except NoNodeError:
                new.append(tp)
            except zk.UNDECODABLE as e:
                log.error("controller: state znode of %s does not decode: %r", tp, e)
        for reread in sorted(await self.partition_states.create(new)):
            await self._on_topic_change(reread)

    async def _on_deletions(self) -> None:
        topics = await self.store.children(zk.DELETE_TOPICS, self._watch("deletions"))
        for topic in topics:
            await self._delete_topic(topic)

    async def _delete_topic(self, topic: str) -> None:
        """Remove the topic's znodes, deepest first, then the deletion request."""
        ops: list[Op] = []
        assignment = self.assignments.get(topic)
        if assignment is not None:
            for p in assignment.partitions:
                for path in (zk.state_path(topic, p), zk.partition_path(topic, p)):
                    if await self.store.exists(path) is not None:
                        ops.append(Delete(path))
            if await self.store.exists(zk.partitions_path(topic)) is not None:
                ops.append(Delete(zk.partitions_path(topic)))
            ops.append(Delete(zk.topic_path(topic)))
        if await self.store.exists(zk.config_path(topic)) is not None:
            ops.append(Delete(zk.config_path(topic)))
        ops.append(Delete(zk.delete_path(topic)))
        for start in range(0, len(ops), OPS_PER_MULTI):
            try:
                await self.write(ops[start : start + OPS_PER_MULTI])
            except NoNodeError:
                continue  # removed already (a retry after a lost connection)
        self._forget(topic)
        log.info("controller: deleted topic %s", topic)

    async def _on_shutdowns(self) -> None:
        """Brokers asking for a controlled shutdown lose their leadership and ISR places."""
        ids = {
            int(b)
            for b in await self.store.children(zk.CONTROLLED_SHUTDOWN, self._watch("shutdowns"))
        }
        new = ids - self.shutting_down
        self.shutting_down = ids
        if not new:
            return
        log.info("controller: controlled shutdown of brokers %s", sorted(new))
        await self.partition_states.refresh(self.partition_states.hosted_on(new))
        # Leadership moves only to another live ISR member: a partition no one else can lead
        # keeps its leader until the broker is gone (Kafka skips it the same way).
        changes: dict[TopicPartition, PartitionState] = {}
        for tp, state in self.states.items():
            if not new & set(state.isr) and state.leader not in new:
                continue
            others = [b for b in state.isr if b not in new]
            if state.leader in new and not any(self.is_eligible(b) for b in others):
                continue
            changes[tp] = self.partition_states.without(tp, state, new)
        await self.partition_states.apply(changes)

    # Elections asked for, and the leader balance ---------------------------------------

    async def elect_leaders(
        self, election_type: ElectionType, partitions: Collection[TopicPartition] | None
    ) -> dict[TopicPartition, Election]:
        """Run an election (None: of every partition) in the controller's order of events.

        Raises NotController if this broker is not, or stops being, the controller."""
        if not self._active:
            raise NotController()
        outcome: asyncio.Future[dict[TopicPartition, Election]] = (
            asyncio.get_running_loop().create_future()
        )
        request = _ElectionRequest(election_type, partitions, outcome)
        self._events.put_nowait(_Event("elect", election=request))
        return await outcome

    async def _on_election(self, request: _ElectionRequest) -> None:
        wanted = list(self.states) if request.partitions is None else request.partitions
        await self.partition_states.refresh(wanted)
        outcomes: dict[TopicPartition, Election] = {}
        for tp in wanted:
            state, replicas = self.states.get(tp), self.replicas(tp)
            if state is None or not replicas:
                outcomes[tp] = Election(ErrorCode.unknown_topic_or_partition)
                continue
            outcomes[tp] = elect(
                request.election_type, replicas, state, self.is_eligible, self.epoch
            )
        await self.partition_states.apply({tp: e.state for tp, e in outcomes.items() if e.state})
        if not request.outcome.done():
            request.outcome.set_result(outcomes)

    async def _check_balance_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.leader_balance.check_interval_s)
            self._events.put_nowait(_Event("balance"))

    async def _on_balance_check(self) -> None:
        replicas = {tp: self.replicas(tp) for tp in self.states}
        chosen = imbalanced_partitions(
            replicas, self.states, self.is_eligible, self.leader_balance.per_broker_percentage
        )
        await self.partition_states.refresh(chosen)
        changes = {}
        for tp in chosen:
            outcome = elect(
                ElectionType.PREFERRED, replicas[tp], self.states[tp], self.is_eligible, self.epoch
            )
            if outcome.state is not None:
                changes[tp] = outcome.state
        if changes:
            log.info("controller: %d partitions return to their preferred replica", len(changes))
        await self.partition_states.apply(changes)

    # Reassignments ---------------------------------------------------------------------

    async def alter_reassignments(
        self, targets: Mapping[TopicPartition, Sequence[int] | None]
    ) -> dict[TopicPartition, Rejection | None]:
        """Start moving partitions to target replicas (None: cancel the move in progress),
        in the controller's order of events; per partition, None or why not.

        Raises NotController if this broker is not, or stops being, the controller."""
        if not self._active:
            raise NotController()
        outcome: asyncio.Future[dict[TopicPartition, Rejection | None]] = (
            asyncio.get_running_loop().create_future()
        )
        request = _ReassignRequest(targets, outcome)
        self._events.put_nowait(_Event("reassign", reassignment=request))
        return await outcome

    def list_reassignments(
        self, partitions: Collection[TopicPartition] | None
    ) -> dict[TopicPartition, ReplicaAssignment]:
        """The moves in progress among `partitions` (None: all of them)."""
        if not self._active:
            raise NotController()
        return self.reassigner.in_progress(partitions)

    def maybe_complete_reassignment(self, tp: TopicPartition) -> None:
        """Queue a look at the move of `tp` (it may complete)."""
        if self._active:
            self._events.put_nowait(
                _Event("reassignment_isr_change", tp.topic, partition=tp.partition)
            )

    async def _on_reassign(self, request: _ReassignRequest) -> None:
        outcomes = {tp: await self.reassigner.reassign(tp, t) for tp, t in request.targets.items()}
        if not request.outcome.done():
            request.outcome.set_result(outcomes)

    async def write(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        """Apply `ops` fenced by the controller epoch; raises the failing op's error, or
        ControllerMoved if this controller was replaced."""
        if not self._active:
            raise ControllerMoved()
        try:
            return list(
                await self.store.multi([Check(zk.CONTROLLER_EPOCH, self._epoch_version), *ops])
            )
        except MultiError as e:
            if e.index == 0:
                raise ControllerMoved() from e
            raise e.error from e


def _fail_waiters(event: _Event | None) -> None:
    """Answer the caller waiting on `event`, if any: NOT_CONTROLLER (it may ask again)."""
    if event is None:
        return
    for request in (event.election, event.reassignment):
        if request is not None and not request.outcome.done():
            request.outcome.set_exception(NotController())
