"""`ZooKeeperStore`: a `MetadataStore` on a real ZooKeeper, through kazoo.

kazoo runs its own threads (a connection loop and callback workers); every call here
starts kazoo's asynchronous variant and waits on an asyncio future that kazoo's callback
resolves with `call_soon_threadsafe`, so the event loop never blocks on ZooKeeper.
Watches and session-state changes cross to the loop the same way. kazoo drops every
watch when the connection drops, even if the session lives on (it has no SetWatches, so
the server forgets them): each dropped watch fires once the store is connected again,
as a change, so its owner reads again and sets it anew. ZooKeeper's errors
become the store's (`NoNodeError`, `BadVersionError`, `ConnectionLossError`, ...): a
write during a disconnection fails with ConnectionLossError instead of being retried,
and one after the session expired with SessionExpiredError, so a broker learns that
its ephemerals are gone and never acts on a session it no longer has.

`zookeeper.connect` may end in a chroot (`host:port/tierbroker`), created on first
connection as Kafka does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError as KazooBadVersion,
)
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.exceptions import (
    NodeExistsError as KazooNodeExists,
)
from kazoo.exceptions import (
    NoNodeError as KazooNoNode,
)
from kazoo.exceptions import (
    NotEmptyError as KazooNotEmpty,
)
from kazoo.exceptions import (
    SessionExpiredError as KazooSessionExpired,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, ZnodeStat
from kazoo.retry import KazooRetry

from tierbroker.broker.metadata.store import (
    BadVersionError,
    Check,
    ConnectionLossError,
    Create,
    Delete,
    MultiError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Op,
    SessionExpiredError,
    SessionState,
    SetData,
    Stat,
    StateListener,
    StoreError,
    Watcher,
    WatchEvent,
)

T = TypeVar("T")

_ERRORS: dict[type[Exception], type[StoreError]] = {
    KazooNoNode: NoNodeError,
    KazooNodeExists: NodeExistsError,
    KazooBadVersion: BadVersionError,
    KazooNotEmpty: NotEmptyError,
    KazooSessionExpired: SessionExpiredError,
    ConnectionLoss: ConnectionLossError,
}
_EVENTS = {
    EventType.CREATED: WatchEvent.CREATED,
    EventType.DELETED: WatchEvent.DELETED,
    EventType.CHANGED: WatchEvent.CHANGED,
    EventType.CHILD: WatchEvent.CHILD,
}
_STATES = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}


def _translate(path: str, error: BaseException) -> BaseException:
    for kazoo_error, ours in _ERRORS.items():
        if isinstance(error, kazoo_error):
            return ours(path)
    if isinstance(error, KazooException):
        return StoreError(path, f"{type(error).__name__}: {error}")
    return error


def _stat(stat: ZnodeStat) -> Stat:
    return Stat(stat.version, stat.czxid, stat.ephemeralOwner, stat.numChildren)


class ZooKeeperStore:
    def __init__(
        self, connect: str, session_timeout_ms: int = 18_000, connection_timeout_ms: int = 18_000
    ) -> None:
        hosts, slash, chroot = connect.partition("/")
        self._hosts = hosts
        self._chroot = "/" + chroot.strip("/") if slash and chroot.strip("/") else ""
        self._timeout_ms = session_timeout_ms
        self._connection_timeout_ms = connection_timeout_ms
        self._client: KazooClient | None = None
        self._listeners: list[StateListener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connected = False  # as the loop last heard
        self._dropped: list[tuple[Watcher, str]] = []  # watches to fire once connected

    @property
    def session_id(self) -> int:
        return self._client.client_id[0] if self._client and self._client.client_id else 0

    @property
    def session_timeout_ms(self) -> int:
        return self._timeout_ms

    def _new_client(self, hosts: str) -> KazooClient:
        return KazooClient(
            hosts=hosts,
            timeout=self._timeout_ms / 1000,
            connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
            command_retry=None,
        )

    async def start(self) -> None:
        """Connect (within `zookeeper.connection.timeout.ms`), creating the chroot if missing."""
        self._loop = asyncio.get_running_loop()
        if self._chroot:
            client = self._new_client(self._hosts)
            await self._connect(client)
            try:
                await self._loop.run_in_executor(None, client.ensure_path, self._chroot)
            finally:
                await self._loop.run_in_executor(None, _stop, client)
        client = self._new_client(self._hosts + self._chroot)
        client.add_listener(self._on_state)
        await self._connect(client)
        self._client = client

    async def _connect(self, client: KazooClient) -> None:
        assert self._loop is not None
        try:
            await self._loop.run_in_executor(None, client.start, self._connection_timeout_ms / 1000)
        except KazooTimeoutError:
            await self._loop.run_in_executor(None, _stop, client)
            raise ConnectionLossError(
                "/",
                f"no ZooKeeper answered at {self._hosts} within {self._connection_timeout_ms} ms",
            ) from None

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is not None:
            await self._loop.run_in_executor(None, _stop, client)

    def add_state_listener(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    def _on_state(self, state: str) -> None:
        """kazoo's thread: hand the change to the loop; never block here."""
        ours = _STATES.get(state)
        if ours is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._session_changed, ours)

    def _session_changed(self, state: SessionState) -> None:
        """Each listener, then each dropped watch, in a callback of its own: one that raises
        is logged by the loop and keeps none of the others from running."""
        assert self._loop is not None
        self._connected = state == SessionState.CONNECTED
        for listener in list(self._listeners):
            self._loop.call_soon(listener, state)
        if self._connected:
            dropped, self._dropped = self._dropped, []
            for watch, path in dropped:
                self._loop.call_soon(watch, WatchEvent.CHANGED, path)

    def _watch(self, watch: Watcher | None, path: str) -> Callable[[Any], None] | None:
        if watch is None:
            return None
        loop = self._loop
        assert loop is not None

        def on_event(event: Any) -> None:
            if loop.is_closed():
                return
            if event.type == EventType.NONE:  # dropped with the connection
                loop.call_soon_threadsafe(self._watch_dropped, watch, path)
                return
            ours = _EVENTS.get(event.type)
            if ours is not None:
                loop.call_soon_threadsafe(watch, ours, event.path)

        return on_event

    def _watch_dropped(self, watch: Watcher, path: str) -> None:
        if self._connected:  # connected again before this was heard
            watch(WatchEvent.CHANGED, path)
        else:
            self._dropped.append((watch, path))

    async def _call(self, path: str, start: Callable[[KazooClient], Any]) -> Any:
        """Start a kazoo async call and wait for its result on the loop."""
        client = self._client
        loop = self._loop
        if client is None or loop is None:
            raise ConnectionLossError(path, "not started")
        future: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any) -> None:
            if future.done():
                return
            try:
                value = result.get(block=False)
            except Exception as e:
                future.set_exception(_translate(path, e))
            else:
                future.set_result(value)

        start(client).rawlink(lambda result: loop.call_soon_threadsafe(settle, result))
        return await future

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        created: str = await self._call(
            path,
            lambda c: c.create_async(
                path, data, ephemeral=ephemeral, sequence=sequential, makepath=make_parents
            ),
        )
        return created

    async def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, Stat]:
        data, stat = await self._call(path, lambda c: c.get_async(path, self._watch(watch, path)))
        return data or b"", _stat(stat)

    async def exists(self, path: str, watch: Watcher | None = None) -> Stat | None:
        stat = await self._call(path, lambda c: c.exists_async(path, self._watch(watch, path)))
        return _stat(stat) if stat is not None else None

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        names = await self._call(
            path, lambda c: c.get_children_async(path, self._watch(watch, path))
        )
        return sorted(names)

    async def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        return _stat(await self._call(path, lambda c: c.set_async(path, data, version)))

    async def delete(self, path: str, version: int = -1) -> None:
        await self._call(path, lambda c: c.delete_async(path, version))

    async def multi(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        def start(client: KazooClient) -> Any:
            transaction = client.transaction()
            for op in ops:
                if isinstance(op, Check):
                    transaction.check(op.path, op.version)
                elif isinstance(op, Create):
                    transaction.create(op.path, op.data, ephemeral=op.ephemeral)
                elif isinstance(op, SetData):
                    transaction.set_data(op.path, op.data, op.version)
                elif isinstance(op, Delete):
                    transaction.delete(op.path, op.version)
            return transaction.commit_async()

        results = await self._call(ops[0].path if ops else "/", start)
        for i, (op, result) in enumerate(zip(ops, results, strict=True)):
            if isinstance(result, Exception) and not isinstance(
                result, RolledBackError | RuntimeInconsistency
            ):
                error = _translate(op.path, result)
                raise MultiError(i, error if isinstance(error, StoreError) else StoreError(op.path))
        return [
            _stat(r) if isinstance(r, ZnodeStat) else (None if r is True else r) for r in results
        ]


def _stop(client: KazooClient) -> None:
    client.stop()
    client.close()
