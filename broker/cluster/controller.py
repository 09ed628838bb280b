"""`Controller`: the one broker that elects partition leaders, as Kafka's ZooKeeper-mode controller.

Every broker runs one; the first to create the ephemeral `/controller` (together with
bumping `/controller_epoch`, in one multi) is active until its session ends. The active
controller watches the live brokers, the topics, deletion requests and controlled-shutdown
requests, and handles each change as an event, one at a time, in its own task:

- a new partition gets its first state: the first live replica of its assignment leads,
  the live replicas are the ISR, leader epoch 0;
- a partition whose leader died, or is shutting down, gets a new leader from its live
  ISR (the first in assignment order) and a new leader epoch; without one it stays
  leaderless (`unclean.leader.election.enable` lets any live replica lead, losing what
  only the ISR had); a dead or shutting-down follower leaves the ISR, except the last;
- a leaderless partition whose ISR member returns is led by it again;
- a deleted topic's znodes are removed (brokers delete the logs when they see it gone);
- an ElectLeaders request, or the periodic leader-balance check, moves leadership back
  to preferred replicas (see `leader_election`);
- an AlterPartitionReassignments request starts (or cancels) moving a partition to other
  replicas; a watch on the state of each partition being moved tells when its new
  replicas are in the ISR, and the move completes (see `reassignment`).

Every write goes in a multi with a check of `/controller_epoch`'s version: a controller
that was replaced (its session expired) cannot change anything, and resigns when it
finds out. A partition's state is written conditionally on its version (the partition
epoch), so a leader changing the ISR at the same time makes one of them retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tierbroker.broker.cluster import zk_data as zk
from tierbroker.broker.cluster.leader_election import (
    Election,
    ElectionType,
    LeaderBalance,
    elect,
    imbalanced_partitions,
)
from tierbroker.broker.cluster.reassigner import Reassigner
from tierbroker.broker.cluster.reassignment import Rejection, ReplicaAssignment
from tierbroker.broker.cluster.store import (
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
    gather_bounded,
)
from tierbroker.broker.cluster.zk_data import PartitionState, TopicAssignment
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

_OPS_PER_MULTI = 400  # ZooKeeper bounds one request (jute.maxbuffer, 1 MiB)


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
    # "reassign", "reassign_isr" (the ISR of `topic`'s `partition`, being moved, changed)
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
        self.states: dict[TopicPartition, PartitionState] = {}
        self.shutting_down: set[int] = set()
        self.moves = Reassigner(self)

    @property
    def is_active(self) -> bool:
        return self._active

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
        self._task = loop.create_task(self._process_events(), name=f"controller-{self.broker_id}")
        if self.leader_balance.enabled:
            self._balance_task = loop.create_task(
                self._check_balance_periodically(), name=f"controller-{self.broker_id}-balance"
            )

    def _resign(self) -> None:
        self._active = False
        for task in (self._task, self._balance_task):
            if task is not None:
                task.cancel()  # an election it was running is answered by its timeout
        self._task = self._balance_task = None
        self._fail_elections()

    # Events --------------------------------------------------------------------------

    def _watch(self, kind: str, topic: str = "") -> Callable[[WatchEvent, str], None]:
        def fired(_event: WatchEvent, _path: str) -> None:
            if self._active:
                self._events.put_nowait(_Event(kind, topic))

        return fired

    async def _process_events(self) -> None:
        while True:
            event = await self._events.get()
            try:
                await self._handle(event)
            except ControllerMoved:
                log.warning("controller %d: a newer controller exists; resigning", self.broker_id)
                self._active = False
                self._fail_elections(event)
                self._elect_soon()
                return
            except SessionExpiredError:
                log.warning("controller %d: session expired; resigning", self.broker_id)
                self._active = False
                self._fail_elections(event)
                return
            except ConnectionLossError as e:
                # Disconnected, perhaps briefly: try again (a lost session ends as above).
                log.info("controller %d: %s while handling %s; retrying", self.broker_id, e, event)
                await asyncio.sleep(0.2)
                self._events.put_nowait(event)

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
        elif event.kind == "reassign_isr":
            await self.moves.on_isr_change(TopicPartition(event.topic, event.partition))

    def _fail_elections(self, current: _Event | None = None) -> None:
        """Answer every election asked of this controller, now resigned: NOT_CONTROLLER."""
        pending = [current] if current is not None else []
        while not self._events.empty():
            pending.append(self._events.get_nowait())
        for event in pending:
            for request in (event.election, event.reassignment):
                if request is not None and not request.outcome.done():
                    request.outcome.set_exception(NotController())

    async def _on_startup(self) -> None:
        self.assignments.clear()
        self.states.clear()
        await self._read_brokers()
        await self._on_shutdowns()
        await self._on_topics_change()
        await self._on_deletions()
        # As Kafka's controller does on failover: replicas on brokers that are not live
        # go offline, out of every ISR (a broker may have died with the old controller).
        await self._on_brokers_gone(
            {b for state in self.states.values() for b in state.isr} - set(self.live_brokers)
        )
        await self._elect_offline(self.states)
        self.moves.resume()

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
        await self._elect_offline(self.states)
        self.moves.check_all()  # a move may wait for a target replica to lead

    async def _on_brokers_gone(self, gone: set[int]) -> None:
        if not gone:
            return
        await self._refresh_states(self._hosted_on(gone))
        changes: dict[TopicPartition, PartitionState] = {}
        for tp, state in self.states.items():
            if state.leader in gone or gone & set(state.isr):
                changes[tp] = self._without(tp, state, gone)
        await self._write_states(changes)

    def _without(
        self, tp: TopicPartition, state: PartitionState, brokers: set[int]
    ) -> PartitionState:
        """`state` with `brokers` out of leadership and the ISR (keeping the last ISR member)."""
        isr = tuple(b for b in state.isr if b not in brokers) or state.isr[-1:]
        if state.leader not in brokers:
            return replace(state, isr=isr, controller_epoch=self.epoch)
        candidates = [
            b for b in self._replicas(tp) if b in isr and self.is_eligible(b) and b not in brokers
        ]
        if candidates:
            return PartitionState(
                candidates[0], state.leader_epoch + 1, isr, self.epoch, state.partition_epoch
            )
        return PartitionState(
            zk.NO_LEADER, state.leader_epoch + 1, isr, self.epoch, state.partition_epoch
        )

    def is_eligible(self, broker: int) -> bool:
        return broker in self.live_brokers and broker not in self.shutting_down

    def _replicas(self, tp: TopicPartition) -> tuple[int, ...]:
        assignment = self.assignments.get(tp.topic)
        return assignment.partitions.get(tp.partition, ()) if assignment else ()

    async def _elect_offline(self, among: Iterable[TopicPartition]) -> None:
        """Lead every leaderless partition (or one led by a broker gone) that can be led."""
        changes: dict[TopicPartition, PartitionState] = {}
        for tp in list(among):
            state = self.states.get(tp)
            if state is None or self.is_eligible(state.leader) or tp.topic not in self.assignments:
                continue
            elected = self._offline_election(tp, state)
            if elected is not None:
                changes[tp] = elected
        await self._write_states(changes)

    def _offline_election(self, tp: TopicPartition, state: PartitionState) -> PartitionState | None:
        replicas = self._replicas(tp)
        live_isr = [b for b in replicas if b in state.isr and self.is_eligible(b)]
        if live_isr:
            isr = tuple(b for b in state.isr if self.is_eligible(b))
            return PartitionState(
                live_isr[0], state.leader_epoch + 1, isr, self.epoch, state.partition_epoch
            )
        if self.unclean_election_enabled(tp.topic):
            live = [b for b in replicas if self.is_eligible(b)]
            if live:
                log.warning(
                    "controller: unclean election of %d for %s: records only ISR %s held are lost",
                    live[0],
                    tp,
                    list(state.isr),
                )
                return PartitionState(
                    live[0], state.leader_epoch + 1, (live[0],), self.epoch, state.partition_epoch
                )
        if state.leader != zk.NO_LEADER:
            return PartitionState(
                zk.NO_LEADER, state.leader_epoch + 1, state.isr, self.epoch, state.partition_epoch
            )
        return None

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
            self.moves.forget([TopicPartition(topic, p) for p in assignment.partitions])

    async def _on_topic_change(self, topic: str) -> None:
        """A topic appeared or got partitions: read it, and elect its new partitions."""
        try:
            data, _ = await self.store.get(zk.topic_path(topic), self._watch("topic", topic))
        except NoNodeError:
            self._forget(topic)
            return
        assignment = TopicAssignment.decode(data)
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
        await self._create_states(new)

    async def _create_states(self, tps: list[TopicPartition]) -> None:
        """First states of new partitions: the first live replica leads, live replicas are the
        ISR (Kafka's NewPartition -> OnlinePartition)."""
        for start in range(0, len(tps), _OPS_PER_MULTI // 3):
            ops: list[Op] = []
            created: dict[TopicPartition, PartitionState] = {}
            for tp in tps[start : start + _OPS_PER_MULTI // 3]:
                live = [b for b in self._replicas(tp) if self.is_eligible(b)]
                state = PartitionState(
                    live[0] if live else zk.NO_LEADER, 0, tuple(live), self.epoch, 0
                )
                if not await self.store.exists(zk.partitions_path(tp.topic)):
                    try:
                        await self.write([Create(zk.partitions_path(tp.topic))])
                    except NodeExistsError:
                        pass
                ops += [
                    Create(zk.partition_path(tp.topic, tp.partition)),
                    Create(zk.state_path(tp.topic, tp.partition), state.encode()),
                ]
                created[tp] = state
            try:
                await self.write(ops)
            except (NodeExistsError, NoNodeError):
                # Created meanwhile by an earlier controller, or the topic was deleted: reread.
                for tp in created:
                    await self._on_topic_change(tp.topic)
                continue
            self.states.update(created)

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
        for start in range(0, len(ops), _OPS_PER_MULTI):
            try:
                await self.write(ops[start : start + _OPS_PER_MULTI])
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
        await self._refresh_states(self._hosted_on(new))
        # Leadership moves only to another live ISR member: a partition no one else can lead
        # keeps its leader until the broker is gone (Kafka skips it the same way).
        changes: dict[TopicPartition, PartitionState] = {}
        for tp, state in self.states.items():
            if not new & set(state.isr) and state.leader not in new:
                continue
            others = [b for b in state.isr if b not in new]
            if state.leader in new and not any(self.is_eligible(b) for b in others):
                continue
            changes[tp] = self._without(tp, state, new)
        await self._write_states(changes)

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
        await self._refresh_states(wanted)
        outcomes: dict[TopicPartition, Election] = {}
        for tp in wanted:
            state, replicas = self.states.get(tp), self._replicas(tp)
            if state is None or not replicas:
                outcomes[tp] = Election(ErrorCode.unknown_topic_or_partition)
                continue
            outcomes[tp] = elect(
                request.election_type, replicas, state, self.is_eligible, self.epoch
            )
        await self._write_states({tp: e.state for tp, e in outcomes.items() if e.state})
        if not request.outcome.done():
            request.outcome.set_result(outcomes)

    async def _check_balance_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.leader_balance.check_interval_s)
            self._events.put_nowait(_Event("balance"))

    async def _on_balance_check(self) -> None:
        replicas = {tp: self._replicas(tp) for tp in self.states}
        chosen = imbalanced_partitions(
            replicas, self.states, self.is_eligible, self.leader_balance.per_broker_percentage
        )
        await self._refresh_states(chosen)
        changes = {}
        for tp in chosen:
            outcome = elect(
                ElectionType.PREFERRED, replicas[tp], self.states[tp], self.is_eligible, self.epoch
            )
            if outcome.state is not None:
                changes[tp] = outcome.state
        if changes:
            log.info("controller: %d partitions return to their preferred replica", len(changes))
        await self._write_states(changes)

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
        return self.moves.in_progress(partitions)

    def post_move_check(self, tp: TopicPartition) -> None:
        """Queue a look at the move of `tp` (it may complete)."""
        if self._active:
            self._events.put_nowait(_Event("reassign_isr", tp.topic, partition=tp.partition))

    async def _on_reassign(self, request: _ReassignRequest) -> None:
        outcomes = {tp: await self.moves.reassign(tp, t) for tp, t in request.targets.items()}
        if not request.outcome.done():
            request.outcome.set_result(outcomes)

    async def _refresh_states(self, tps: Iterable[TopicPartition]) -> None:
        """Read again the states of partitions about to be decided on: their leaders change
        their ISRs without this controller (Kafka's controller learns of it through ISR
        change notifications; reading before deciding needs no more znodes)."""
        await gather_bounded(self.refresh_state(tp) for tp in list(tps) if tp in self.states)

    async def refresh_state(self, tp: TopicPartition) -> None:
        try:
            data, stat = await self.store.get(zk.state_path(tp.topic, tp.partition))
        except NoNodeError:
            return  # being deleted: the deletion event forgets it
        self.states[tp] = PartitionState.decode(data, stat.version)

    def _hosted_on(self, brokers: set[int]) -> list[TopicPartition]:
        return [tp for tp in self.states if brokers & set(self._replicas(tp))]

    # Writes --------------------------------------------------------------------------

    async def _write_states(self, changes: dict[TopicPartition, PartitionState]) -> None:
        """Write new partition states, each conditional on the version it replaces; a state
        changed meanwhile (a leader's ISR write) is read again and decided again."""
        items = [(tp, s) for tp, s in changes.items() if s != self.states.get(tp)]
        moved = sum(1 for tp, s in items if s.leader != self._leader_of(tp))
        if moved:
            log.info("controller: %d partitions get a new leader", moved)
        for start in range(0, len(items), _OPS_PER_MULTI - 1):
            chunk = items[start : start + _OPS_PER_MULTI - 1]
            ops: list[Op] = [
                SetData(zk.state_path(tp.topic, tp.partition), s.encode(), s.partition_epoch)
                for tp, s in chunk
            ]
            try:
                results = await self.write(ops)
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
        path = zk.state_path(tp.topic, tp.partition)
        for _ in range(10):
            try:
                results = await self.write([SetData(path, state.encode(), state.partition_epoch)])
            except NoNodeError:
                self.states.pop(tp, None)
                return
            except BadVersionError:
                data, stat = await self.store.get(path)
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
        gone = {b for b in current.isr if not self.is_eligible(b)}
        if current.leader != wanted.leader and not self.is_eligible(current.leader):
            gone.add(current.leader)
        if not gone and self.is_eligible(current.leader):
            return current
        decided = self._without(tp, current, gone)
        if decided.leader == zk.NO_LEADER:
            return self._offline_election(tp, decided) or decided
        return decided

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
