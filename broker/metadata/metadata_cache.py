"""`MetadataCache`: this broker's view of the cluster, followed from the `MetadataStore`.

Brokers follow metadata (as KRaft brokers do) instead of being told: the cache reads
the live brokers (and those in a controlled shutdown), the controller, every topic's
assignment and configs, and every partition's state, and keeps a one-shot watch on
each. A watch that fires marks what it watched as stale; one task re-reads stale znodes
in the order they fired, updates the cache and hands each `MetadataDelta` to the
listeners (the ReplicaManager). After the session is lost, every watch is gone: the
whole view is read again.

Handlers read the cache, never the store: its reads are plain dict lookups on the event
loop. Not shared across event loops.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.store import (
    ConnectionLossError,
    MetadataStore,
    NoNodeError,
    SessionExpiredError,
    SessionState,
    WatchEvent,
    gather_bounded,
)
from tierbroker.broker.metadata.zk_data import BrokerRegistration, PartitionState, TopicAssignment
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MetadataDelta:
    """What one refresh changed: partition states (None: the partition is gone), topics
    deleted, topics whose configs changed, whether the live brokers changed, and whether
    dynamic broker configs did."""

    partitions: dict[TopicPartition, PartitionState | None] = field(default_factory=dict)
    deleted_topics: set[str] = field(default_factory=set)
    configs_changed: set[str] = field(default_factory=set)
    brokers_changed: bool = False
    broker_configs_changed: bool = False

    def __bool__(self) -> bool:
        return bool(
            self.partitions
            or self.deleted_topics
            or self.configs_changed
            or self.brokers_changed
            or self.broker_configs_changed
        )


# What a watch marks stale: ("brokers",), ("controller",), ("topics",), ("topic", name),
# ("state", name, partition), ("config", name), ("broker_configs",), ("broker_config", entity).
_Stale = tuple[str, ...]


class MetadataCache:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.cluster_id = ""
        self.controller_id = -1
        self.brokers: dict[int, BrokerRegistration] = {}
        self.shutting_down: set[int] = set()  # brokers in a controlled shutdown
        self.topics: dict[str, TopicAssignment] = {}
        self.configs: dict[str, dict[str, str]] = {}
        # Dynamic broker configs by entity: a broker id, or zk.DEFAULT_BROKER_ENTITY.
        self.broker_configs: dict[str, dict[str, str]] = {}
        self.states: dict[TopicPartition, PartitionState] = {}
        self._names_by_id: dict[uuid.UUID, str] = {}
        self._listeners: list[Callable[[MetadataDelta], None]] = []
        self._stale: dict[_Stale, None] = {}  # an ordered set
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._resync = False
        self.full_reads = 0  # the whole view was read this many times

    # Queries -------------------------------------------------------------------------

    def topic_by_id(self, topic_id: uuid.UUID) -> str | None:
        return self._names_by_id.get(topic_id)

    def partition_count(self, topic: str) -> int:
        assignment = self.topics.get(topic)
        return len(assignment.partitions) if assignment is not None else 0

    def replicas(self, tp: TopicPartition) -> tuple[int, ...]:
        assignment = self.topics.get(tp.topic)
        if assignment is None:
            return ()
        return assignment.partitions.get(tp.partition, ())

    def leader(self, tp: TopicPartition) -> int:
        state = self.states.get(tp)
        return state.leader if state is not None else zk.NO_LEADER

    def leader_endpoint(self, tp: TopicPartition) -> BrokerRegistration | None:
        return self.brokers.get(self.leader(tp))

    def has_leaders(self, topic: str) -> bool:
        """Every partition of `topic` has a live leader in this view."""
        assignment = self.topics.get(topic)
        return assignment is not None and all(
            self.leader(TopicPartition(topic, p)) in self.brokers for p in assignment.partitions
        )

    # Following the store -------------------------------------------------------------

    def add_listener(self, listener: Callable[[MetadataDelta], None]) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        """Read the whole view, then follow changes in a task owned here."""
        self.store.add_state_listener(self._on_session_state)
        await self._read_all()
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="metadata-cache")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `condition()` holds after some change; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                while not condition():
                    await self._changed.wait()
        except TimeoutError:
            return condition()
        return True

    def _on_session_state(self, state: SessionState) -> None:
        # A new session (after LOST) has none of the old one's watches: read everything again.
        if state == SessionState.LOST:
            self._resync = True
        elif state == SessionState.CONNECTED and self._resync:
            self._resync = False
            self._mark(("all",))

    def _watch(self, *stale: str) -> Callable[[WatchEvent, str], None]:
        key: _Stale = stale

        def fired(_event: WatchEvent, _path: str) -> None:
            self._mark(key)

        return fired

    def _mark(self, key: _Stale) -> None:
        self._stale[key] = None
        self._wake.set()

    async def _follow(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            stale, self._stale = list(self._stale), {}
            try:
                delta = await self._refresh(stale)
            except (ConnectionLossError, SessionExpiredError) as e:
                # Disconnected: what was stale is read again once the session is back.
                log.info("metadata refresh postponed: %s", e)
                for key in stale:
                    self._stale.setdefault(key, None)
                continue
            except Exception:
                # Not a store outage: logged; what was stale is read again at the next change.
                log.exception("metadata refresh failed")
                for key in stale:
                    self._stale.setdefault(key, None)
                continue
            self._publish(delta)

    async def _refresh(self, stale: list[_Stale]) -> MetadataDelta:
        if ("all",) in stale:
            return await self._read_all()
        delta = MetadataDelta()
        for key in stale:
            kind = key[0]
            if kind == "brokers":
                delta.brokers_changed |= await self._read_brokers()
            elif kind == "shutdowns":
                await self._read_shutdowns()
            elif kind == "controller":
                await self._read_controller()
            elif kind == "topics":
                await self._read_topics(delta)
            elif kind == "topic":
                await self._read_topic(key[1], delta)
            elif kind == "state":
                await self._read_state(TopicPartition(key[1], int(key[2])), delta)
            elif kind == "config":
                await self._read_config(key[1], delta)
            elif kind == "broker_configs":
                delta.broker_configs_changed |= await self._read_broker_configs()
            elif kind == "broker_config":
                delta.broker_configs_changed |= await self._read_broker_config(key[1])
        return delta

    def _publish(self, delta: MetadataDelta) -> None:
        if delta:
            for listener in self._listeners:
                try:
                    listener(delta)
                except Exception:
                    log.exception("a metadata listener failed")
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _read_all(self) -> MetadataDelta:
        """Read the whole view; the delta from the view held before."""
        data, _ = await self.store.get(zk.CLUSTER_ID)
        self.cluster_id = zk.decode_cluster_id(data)
        delta = MetadataDelta(brokers_changed=await self._read_brokers())
        await self._read_shutdowns()
        await self._read_controller()
        await self._read_topics(delta, reread=True)
        delta.broker_configs_changed = await self._read_broker_configs()
        self.full_reads += 1
        return delta

    async def _read_brokers(self) -> bool:
        ids = await self.store.children(zk.BROKER_IDS, self._watch("brokers"))
        brokers: dict[int, BrokerRegistration] = {}
        for name in ids:
            try:
                data, stat = await self.store.get(zk.broker_path(int(name)))
            except NoNodeError:
                continue  # gone since the listing; its deletion fired the watch
            try:
                brokers[int(name)] = BrokerRegistration.decode(int(name), data, stat.czxid)
            except zk.UNDECODABLE as e:
                log.error("broker registration %s does not decode: %r", name, e)
        changed = brokers != self.brokers
        self.brokers = brokers
        return changed

    async def _read_shutdowns(self) -> None:
        names = await self.store.children(zk.CONTROLLED_SHUTDOWN, self._watch("shutdowns"))
        self.shutting_down = {int(name) for name in names}

    async def _read_controller(self) -> None:
        watch = self._watch("controller")
        try:
            data, _ = await self.store.get(zk.CONTROLLER, watch)
            self.controller_id = zk.decode_controller(data)
        except NoNodeError:
            self.controller_id = -1
            if await self.store.exists(zk.CONTROLLER, watch) is not None:
                self._mark(("controller",))  # created in between: read it again

    async def _read_topics(self, delta: MetadataDelta, reread: bool = False) -> None:
        names = set(await self.store.children(zk.TOPICS, self._watch("topics")))
        for gone in set(self.topics) - names:
            self._forget_topic(gone, delta)
        todo = sorted(names if reread else names - set(self.topics))
        await gather_bounded(self._read_topic(name, delta, reread) for name in todo)

    async def _read_topic(self, name: str, delta: MetadataDelta, reread: bool = False) -> None:
        """Read a topic's assignment, and the states of its partitions that are new or moved
        (`reread`: of all of them, which also arms their watches again)."""
        try:
            data, _ = await self.store.get(zk.topic_path(name), self._watch("topic", name))
        except NoNodeError:
            self._forget_topic(name, delta)
            return
        try:
            assignment = TopicAssignment.decode(data)
        except zk.UNDECODABLE as e:
            log.error("topic znode of %r does not decode: %r", name, e)
            return
        previous = self.topics.get(name)
        if previous is not None and previous.topic_id != assignment.topic_id:
            self._forget_topic(name, delta)  # deleted and created again between two reads
            previous = None
        self.topics[name] = assignment
        self._names_by_id[assignment.topic_id] = name
        if previous is None or reread or name not in self.configs:
            await self._read_config(name, delta)
        known = previous.partitions if previous is not None else {}
        for p in set(known) - set(assignment.partitions):
            tp = TopicPartition(name, p)
            self.states.pop(tp, None)
            delta.partitions[tp] = None
        await gather_bounded(
            self._read_state(TopicPartition(name, p), delta)
            for p in sorted(assignment.partitions)
            if reread or previous is None or p not in known or known[p] != assignment.partitions[p]
        )

    def _forget_topic(self, name: str, delta: MetadataDelta) -> None:
        assignment = self.topics.pop(name, None)
        self.configs.pop(name, None)
        if assignment is None:
            return
        if self._names_by_id.get(assignment.topic_id) == name:
            del self._names_by_id[assignment.topic_id]
        for p in assignment.partitions:
            tp = TopicPartition(name, p)
            self.states.pop(tp, None)
            delta.partitions[tp] = None
        delta.deleted_topics.add(name)

    async def _read_state(self, tp: TopicPartition, delta: MetadataDelta) -> None:
        if tp.topic not in self.topics:
            return
        path = zk.state_path(tp.topic, tp.partition)
        watch = self._watch("state", tp.topic, str(tp.partition))
        try:
            data, stat = await self.store.get(path, watch)
        except NoNodeError:
            # Not elected yet: told when the controller creates it.
            if await self.store.exists(path, watch) is not None:
                self._mark(("state", tp.topic, str(tp.partition)))
            return
        try:
            state = PartitionState.decode(data, stat.version)
        except zk.UNDECODABLE as e:
            log.error("state znode of %s does not decode: %r", tp, e)
            return
        if self.states.get(tp) != state:
            self.states[tp] = state
            delta.partitions[tp] = state

    async def _read_config(self, name: str, delta: MetadataDelta) -> None:
        watch = self._watch("config", name)
        try:
            data, _ = await self.store.get(zk.config_path(name), watch)
            configs = zk.decode_config(data)
        except zk.UNDECODABLE as e:
            log.error("config znode of %r does not decode: %r", name, e)
            return
        except NoNodeError:
            configs = {}
            if await self.store.exists(zk.config_path(name), watch) is not None:
                self._mark(("config", name))
        if self.configs.get(name) != configs and name in self.topics:
            self.configs[name] = configs
            delta.configs_changed.add(name)

    async def _read_broker_configs(self) -> bool:
        """Every entity's dynamic broker configs; whether any changed."""
        entities = await self.store.children(zk.BROKER_CONFIGS, self._watch("broker_configs"))
        changed = False
        for gone in set(self.broker_configs) - set(entities):
            del self.broker_configs[gone]
            changed = True
        for entity in entities:
            changed |= await self._read_broker_config(entity)
        return changed

    async def _read_broker_config(self, entity: str) -> bool:
        path = zk.broker_config_path(entity)
        try:
            data, _ = await self.store.get(path, self._watch("broker_config", entity))
            configs = zk.decode_config(data)
        except NoNodeError:
            return self.broker_configs.pop(entity, None) is not None
        except zk.UNDECODABLE as e:
            log.error("broker config znode %s does not decode: %r", path, e)
            return False
        changed = self.broker_configs.get(entity) != configs
        self.broker_configs[entity] = configs
        return changed
