"""`BrokerLifecycle`: this broker's registration in the cluster, and what its session allows.

Registration is an ephemeral `/brokers/ids/N` with each listener's advertised endpoint;
its creating transaction is the broker epoch. A registration left by this broker's
previous process (killed before its session expired) is waited out, up to 1.5 session
timeouts; one owned by another live broker is a start-up error.

A leader must not acknowledge acks=all writes once a successor may exist: when the
session has been suspended (no answer from the store) for a whole session timeout, or
is lost, the ReplicaManager is fenced (acks=all answers NOT_LEADER_OR_FOLLOWER) until
the session is back, or, after a loss, until this broker has registered again and
applied the metadata it missed.

Controlled shutdown (`controlled_shutdown`): ask the controller to move this broker's
leadership away and wait until it has, in at most `controlled.shutdown.max.retries`
attempts `controlled.shutdown.retry.backoff.ms` apart, each given an equal share of the
time left before the shutdown's deadline; it reports why it did not complete instead of
waiting on an unreachable store. Not shared across event loops.
"""

from __future__ import annotations

import asyncio
import logging

from tierbroker.broker.config.listeners import Listener
from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.metadata_cache import MetadataCache
from tierbroker.broker.metadata.store import (
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    SessionState,
    StoreError,
)
from tierbroker.broker.metadata.zk_data import BrokerRegistration
from tierbroker.broker.replication.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

_REGISTRATION_RETRY_S = 0.2


class RegistrationError(Exception):
    """Another live broker holds this broker's id."""


class BrokerLifecycle:
    def __init__(
        self,
        broker_id: int,
        rack: str | None,
        store: MetadataStore,
        cache: MetadataCache,
        replicas: ReplicaManager,
    ) -> None:
        self.broker_id = broker_id
        self.rack = rack
        self.store = store
        self.cache = cache
        self.replicas = replicas
        self.registration: BrokerRegistration | None = None
        self._endpoints: tuple[Listener, ...] = ()
        self._fence_timer: asyncio.TimerHandle | None = None
        self._rejoining: asyncio.Task[None] | None = None
        self._lost = False
        self._session = SessionState.CONNECTED
        self._closed = False

    @property
    def store_reachable(self) -> bool:
        """The store session is connected (as last reported)."""
        return self._session == SessionState.CONNECTED

    async def register(self, endpoints: tuple[Listener, ...]) -> BrokerRegistration:
        """Register, then follow the session: call once, after the broker listens."""
        self._endpoints = endpoints
        registration = await self._register()
        self.store.add_state_listener(self._on_session_state)
        return registration

    async def _register(self) -> BrokerRegistration:
        endpoints = self._endpoints
        wanted = BrokerRegistration(self.broker_id, endpoints, self.rack)
        path = zk.broker_path(self.broker_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.5 * self.store.session_timeout_ms / 1000
        while True:
            try:
                await self.store.create(path, wanted.encode(), ephemeral=True)
                break
            except NodeExistsError:
                try:
                    _, stat = await self.store.get(path)
                except NoNodeError:
                    continue
                if stat.ephemeral_owner == self.store.session_id:
                    break
                if loop.time() > deadline:
                    raise RegistrationError(
                        f"broker.id={self.broker_id} is registered by another live broker "
                        f"(session {stat.ephemeral_owner:#x}): give this broker another broker.id"
                    ) from None
                await asyncio.sleep(_REGISTRATION_RETRY_S)
        _, stat = await self.store.get(path)
        self.registration = BrokerRegistration(self.broker_id, endpoints, self.rack, stat.czxid)
        self.replicas.broker_epoch = stat.czxid
        # Topics created from here on may place replicas here: the cache must know it.
        await self.cache.wait_until(
            lambda: self.broker_id in self.cache.brokers, self.store.session_timeout_ms / 1000
        )
        log.info(
            "broker %d registered at %s (rack %s, broker epoch %d)",
            self.broker_id,
            ", ".join(map(str, endpoints)),
            self.rack,
            stat.czxid,
        )
        return self.registration

    def _on_session_state(self, state: SessionState) -> None:
        if self._closed:  # the broker is stopping: the session's end is no news
            return
        loop = asyncio.get_running_loop()
        self._session = state
        if state == SessionState.SUSPENDED:
            if self._fence_timer is None:
                self._fence_timer = loop.call_later(
                    self.store.session_timeout_ms / 1000, self._fence, "suspended"
                )
            return
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None
        if state == SessionState.LOST:
            self._lost = True
            self._fence("lost")
        elif state == SessionState.CONNECTED:
            if not self._lost:
                self.replicas.unfence()
            elif self._rejoining is None or self._rejoining.done():
                self._rejoining = loop.create_task(
                    self._rejoin(), name=f"broker-{self.broker_id}-rejoin"
                )

    def _fence(self, why: str) -> None:
        self._fence_timer = None
        if not self.replicas.fenced:
            log.warning(
                "broker %d: metadata store session %s: no acks=all write is acknowledged "
                "until it is back",
                self.broker_id,
                why,
            )
            self.replicas.fence()

    async def _rejoin(self) -> None:
        """After a lost session: register again, catch up with the metadata, then serve."""
        reads = self.cache.full_reads
        try:
            await self._register()
        except (StoreError, RegistrationError) as e:
            log.warning("broker %d: registering again failed: %s", self.broker_id, e)
            return
        await self.cache.wait_until(
            lambda: self.cache.full_reads > reads, self.store.session_timeout_ms / 1000
        )
        await self.replicas.applied.wait()
        self._lost = False
        self.replicas.unfence()
        log.info("broker %d: serving again after a new metadata store session", self.broker_id)

    async def controlled_shutdown(
        self, deadline: float, max_retries: int, backoff_s: float
    ) -> str | None:
        """Move this broker's leadership away (to other live ISR members) before `deadline`
        (loop time): None once nothing more can move, else why it could not."""
        loop = asyncio.get_running_loop()
        why = "no time left"
        for attempt in range(max_retries):
            if attempt:
                await asyncio.sleep(max(0.0, min(backoff_s, deadline - loop.time())))
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(left / (max_retries - attempt)):
                    await self._ask_controller()
                    await self.cache.wait_until(lambda: not self.leads_movable_partitions(), left)
                    await self.replicas.applied.wait()
                    return None
            except TimeoutError:
                why = (
                    f"broker {self.broker_id} still leads partitions"
                    if self.store_reachable
                    else "the metadata store (ZooKeeper) is unreachable"
                )
            except StoreError as e:
                why = f"the metadata store (ZooKeeper) is unreachable: {e}"
            log.warning(
                "broker %d: controlled shutdown attempt %d of %d failed: %s",
                self.broker_id,
                attempt + 1,
                max_retries,
                why,
            )
        return why

    async def _ask_controller(self) -> None:
        if not self.leads_movable_partitions():
            return
        try:
            await self.store.create(
                zk.controlled_shutdown_path(self.broker_id), ephemeral=True, make_parents=True
            )
        except NodeExistsError:
            pass

    def leads_movable_partitions(self) -> bool:
        """Leads a partition that another live, in-sync replica could lead."""
        for state in self.cache.states.values():
            if state.leader != self.broker_id:
                continue
            if any(b != self.broker_id and b in self.cache.brokers for b in state.isr):
                return True
        return False

    async def close(self) -> None:
        self._closed = True
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        if self._rejoining is not None:
            self._rejoining.cancel()
            await asyncio.gather(self._rejoining, return_exceptions=True)
