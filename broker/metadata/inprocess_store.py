"""`InProcessZooKeeper`: ZooKeeper's data model and guarantees for brokers in one process.

The embedded coordination service of `tierbroker serve` (one broker, or `--brokers N`):
each broker opens an `InProcessSession`, a `MetadataStore` it cannot tell from a real
ZooKeeper's. Semantics kept: znodes with versions and creating transaction ids;
sessions owning ephemeral znodes; one-shot data and child watches, per session; atomic
`multi`; writes applied one after another in the order they were made.

Durability, as ZooKeeper's: a write is acknowledged, its watches fire and later reads
see it only once it is on disk (`ZnodeDatabase`). Writes queue and are applied in
batches: a batch is applied to the tree, stored in one transaction in a worker thread,
then acknowledged; reads wait while a batch is being stored. A batch that cannot be
stored (a full disk) is undone and each of its writes fails with `StorageUnavailable`,
so nothing acted upon was ever lost. Not thread-safe: one event loop owns it.

Tests (and fixtures) can end a session at will: `expire()` (the session is gone: LOST,
then CONNECTED with a new one), `suspend()` / `resume()` (the client loses the
service: SUSPENDED; after the session timeout the service expires the session, which
the client learns when it comes back) and `abandon()` (the client crashed: it is told
nothing, its calls fail, and the service expires the session after its timeout).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tierbroker.broker.metadata.store import (
    BadVersionError,
    Check,
    ConnectionLossError,
    Create,
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
    parent_of,
)
from tierbroker.broker.metadata.znode_db import StoredZnode, Write, ZnodeDatabase

log = logging.getLogger(__name__)

T = TypeVar("T")


class StorageUnavailable(ConnectionLossError):
    """The service could not store a write (its disk failed); nothing of it was applied."""


@dataclass(slots=True)
class _Znode:
    data: bytes
    czxid: int
    mzxid: int
    ephemeral_owner: int = 0
    version: int = 0
    cversion: int = 0  # child changes: numbers sequential children
    children: set[str] = field(default_factory=set)

    def stat(self) -> Stat:
        return Stat(self.version, self.czxid, self.ephemeral_owner, len(self.children))


@dataclass(slots=True)
class _Pending:
    """A queued write: runs `apply` against the tree when its batch is applied."""

    session_id: int
    apply: Callable[[_Batch], object]
    result: asyncio.Future[object]


@dataclass(slots=True)
class _Batch:
    """Writes applied together: what to store, how to undo them, which watches to fire."""

    zxid: Callable[[], int]
    writes: dict[str, Write] = field(default_factory=dict)
    undo: list[Callable[[], None]] = field(default_factory=list)
    events: list[tuple[str, WatchEvent, bool]] = field(default_factory=list)  # path, event, child


class InProcessZooKeeper:
    """The service: one znode tree shared by every session in the process."""

    def __init__(self, db_path: Path | None = None) -> None:
        self._db = ZnodeDatabase(db_path) if db_path is not None else None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="znode-db")
        self._tree: dict[str, _Znode] = {"/": _Znode(b"", 0, 0)}
        self._zxid = 0
        self._sessions: dict[int, InProcessSession] = {}
        self._session_ids = itertools.count(1)
        self._data_watches: dict[str, dict[int, list[Watcher]]] = defaultdict(dict)
        self._child_watches: dict[str, dict[int, list[Watcher]]] = defaultdict(dict)
        self._queue: list[_Pending] = []
        self._wake = asyncio.Event()
        self._storing: asyncio.Future[None] | None = None  # the batch being stored
        self._writer: asyncio.Task[None] | None = None
        self._expiry_timers: dict[int, asyncio.TimerHandle] = {}
        self._expiring: set[asyncio.Task[None]] = set()  # sessions timed out, ending now

    async def open(self) -> None:
        """Load the stored znodes and start applying writes."""
        if self._db is not None:
            epoch, stored = await self._run(self._db.open)
            self._zxid = epoch << 32
            for z in stored:
                self._tree[z.path] = _Znode(
                    z.data, z.czxid, z.mzxid, version=z.version, cversion=z.cversion
                )
            for path in self._tree:
                if path != "/":
                    self._tree[parent_of(path)].children.add(path.rsplit("/", 1)[1])
        self._writer = asyncio.get_running_loop().create_task(self._write_batches(), name="zk")

    async def close(self) -> None:
        """Expire every session, stop the writer (queued writes fail), close the database."""
        for session in list(self._sessions.values()):
            await session.close()
        for timer in self._expiry_timers.values():
            timer.cancel()
        # Expiries under way finish while the writer still runs: none outlives the service.
        await asyncio.gather(*self._expiring)
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        for pending in self._queue:
            if not pending.result.done():
                pending.result.set_exception(ConnectionLossError("/", "the service stopped"))
        self._queue.clear()
        if self._db is not None:
            await self._run(self._db.close)
        self._executor.shutdown(wait=True)

    def session(self, session_timeout_ms: int = 18_000) -> InProcessSession:
        return InProcessSession(self, session_timeout_ms)

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    # Sessions ------------------------------------------------------------------------

    def _open_session(self, session: InProcessSession) -> int:
        session_id = (self._zxid & ~0xFFFFFFFF) | next(self._session_ids)
        self._sessions[session_id] = session
        return session_id

    async def _end_session(self, session_id: int) -> None:
        """Delete the session's ephemerals and forget its watches."""
        self._sessions.pop(session_id, None)
        timer = self._expiry_timers.pop(session_id, None)
        if timer is not None:
            timer.cancel()
        for watches in (*self._data_watches.values(), *self._child_watches.values()):
            watches.pop(session_id, None)
        owned = [p for p, z in self._tree.items() if z.ephemeral_owner == session_id]

        def delete_owned(batch: _Batch) -> None:
            for path in owned:
                if path in self._tree:
                    self._delete(batch, path, -1)

        if owned:
            await self.submit(0, delete_owned)

    def _expire_later(self, session_id: int, timeout_ms: int) -> None:
        self._expiry_timers[session_id] = asyncio.get_running_loop().call_later(
            timeout_ms / 1000, self._start_expiry, session_id
        )

    def _start_expiry(self, session_id: int) -> None:
        task = asyncio.get_running_loop().create_task(self._expire(session_id), name="zk-expire")
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)

    async def _expire(self, session_id: int) -> None:
        """The session timed out: end it. A failure is logged; the session is gone anyway."""
        try:
            await self._end_session(session_id)
        except StoreError as e:
            log.error("session 0x%x expired; its ephemerals not deleted: %s", session_id, e)
        except Exception:
            log.exception("session 0x%x expired; ending it failed", session_id)

    def _is_live(self, session_id: int) -> bool:
        return session_id in self._sessions and session_id not in self._expiry_timers

    # Reads ---------------------------------------------------------------------------

    async def read(self) -> None:
        """Wait until no batch is being stored: a read sees only what is on disk."""
        while self._storing is not None:
            await asyncio.shield(self._storing)

    def znode(self, path: str) -> _Znode:
        found = self._tree.get(path)
        if found is None:
            raise NoNodeError(path)
        return found

    def watch(self, path: str, session_id: int, watcher: Watcher, *, child: bool) -> None:
        table = self._child_watches if child else self._data_watches
        table[path].setdefault(session_id, []).append(watcher)

    # Writes --------------------------------------------------------------------------

    async def submit(self, session_id: int, apply: Callable[[_Batch], object]) -> object:
        """Queue a write; its result once it is stored (or its error)."""
        result: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(session_id, apply, result))
        self._wake.set()
        try:
            return await result
        finally:
            del result  # an error's traceback holds this frame: no cycle through the future

    async def _write_batches(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            queue, self._queue = self._queue, []
            batch = _Batch(self._next_zxid)
            applied: list[tuple[_Pending, object]] = []
            for pending in queue:
                if pending.result.done():
                    continue
                if pending.session_id and pending.session_id not in self._sessions:
                    pending.result.set_exception(SessionExpiredError("/"))
                    continue
                try:
                    applied.append((pending, pending.apply(batch)))
                except StoreError as e:
                    pending.result.set_exception(e)
            if batch.writes and self._db is not None:
                if not await self._store(batch, applied):
                    continue
            for pending, value in applied:
                if not pending.result.done():
                    pending.result.set_result(value)
            self._fire(batch.events)

    async def _store(self, batch: _Batch, applied: list[tuple[_Pending, object]]) -> bool:
        """Store the batch; if that fails, undo it and fail its writes."""
        assert self._db is not None
        db = self._db
        writes = list(batch.writes.values())
        self._storing = asyncio.get_running_loop().create_future()
        try:
            await self._run(lambda: db.write(writes))
        except Exception as e:
            log.error(
                "cannot store metadata in %s; %d writes refused: %s", db.path, len(applied), e
            )
            for undo in reversed(batch.undo):
                undo()
            for pending, _ in applied:
                if not pending.result.done():
                    pending.result.set_exception(StorageUnavailable(str(db.path), str(e)))
            return False
        finally:
            self._storing.set_result(None)
            self._storing = None
        return True

    def _next_zxid(self) -> int:
        self._zxid += 1
        return self._zxid

    def _fire(self, events: list[tuple[str, WatchEvent, bool]]) -> None:
        loop = asyncio.get_running_loop()
        for path, event, child in events:
            table = self._child_watches if child else self._data_watches
            for session_id, watchers in table.pop(path, {}).items():
                session = self._sessions.get(session_id)
                if session is None:
                    continue
                for watcher in watchers:
                    if session_id in self._expiry_timers:  # delivered if it comes back in time
                        session.missed.append((watcher, event, path))
                    else:
                        loop.call_soon(watcher, event, path)

    def _remember(self, batch: _Batch, path: str) -> None:
        znode = self._tree.get(path)
        if znode is None:
            batch.writes[path] = path
        elif not znode.ephemeral_owner:
            batch.writes[path] = StoredZnode(
                path, znode.data, znode.version, znode.czxid, znode.mzxid, znode.cversion
            )

    def _create(self, batch: _Batch, path: str, data: bytes, owner: int, sequential: bool) -> str:
        parent_path = parent_of(path)
        parent = self._tree.get(parent_path)
        if parent is None:
            raise NoNodeError(path, f"no parent {parent_path}")
        if parent.ephemeral_owner:
            raise StoreError(path, "an ephemeral znode has no children")
        if sequential:
            path = f"{path}{parent.cversion:010d}"
        if path in self._tree:
            raise NodeExistsError(path)
        zxid = batch.zxid()
        name = path.rsplit("/", 1)[1]
        self._tree[path] = _Znode(data, zxid, zxid, owner)
        parent.children.add(name)
        parent.cversion += 1

        def undo() -> None:
            del self._tree[path]
            parent.children.discard(name)
            parent.cversion -= 1

        batch.undo.append(undo)
        if not owner:  # ephemerals die with the process: nothing of them is stored
            self._remember(batch, path)
            self._remember(batch, parent_path)
        batch.events += [(path, WatchEvent.CREATED, False), (parent_path, WatchEvent.CHILD, True)]
        return path

    def _check(self, path: str, version: int) -> _Znode:
        znode = self.znode(path)
        if version != -1 and version != znode.version:
            raise BadVersionError(path, f"version {znode.version}, expected {version}")
        return znode

    def _set(self, batch: _Batch, path: str, data: bytes, version: int) -> Stat:
        znode = self._check(path, version)
        before = (znode.data, znode.version, znode.mzxid)
        znode.data, znode.version, znode.mzxid = data, znode.version + 1, batch.zxid()

        def undo() -> None:
            znode.data, znode.version, znode.mzxid = before

        batch.undo.append(undo)
        self._remember(batch, path)
        batch.events.append((path, WatchEvent.CHANGED, False))
        return znode.stat()

    def _delete(self, batch: _Batch, path: str, version: int) -> None:
        znode = self._check(path, version)
        if znode.children:
            raise NotEmptyError(path)
        parent_path = parent_of(path)
        parent = self._tree[parent_path]
        name = path.rsplit("/", 1)[1]
        del self._tree[path]
        parent.children.discard(name)
        parent.cversion += 1
        batch.zxid()

        def undo() -> None:
            self._tree[path] = znode
            parent.children.add(name)
            parent.cversion -= 1

        batch.undo.append(undo)
        if not znode.ephemeral_owner:
            self._remember(batch, path)
            self._remember(batch, parent_path)
        batch.events += [
            (path, WatchEvent.DELETED, False),
            (path, WatchEvent.DELETED, True),
            (parent_path, WatchEvent.CHILD, True),
        ]

    def _multi(self, batch: _Batch, owner: int, ops: Sequence[Op]) -> list[str | Stat | None]:
        undo_from = len(batch.undo)
        events_from = len(batch.events)
        writes = dict(batch.writes)
        results: list[str | Stat | None] = []
        for i, op in enumerate(ops):
            try:
                if isinstance(op, Check):
                    self._check(op.path, op.version)
                    results.append(None)
                elif isinstance(op, Create):
                    results.append(
                        self._create(batch, op.path, op.data, owner if op.ephemeral else 0, False)
                    )
                elif isinstance(op, SetData):
                    results.append(self._set(batch, op.path, op.data, op.version))
                else:
                    self._delete(batch, op.path, op.version)
                    results.append(None)
            except StoreError as e:
                for undo in reversed(batch.undo[undo_from:]):
                    undo()
                del batch.undo[undo_from:]
                del batch.events[events_from:]
                batch.writes = writes
                raise MultiError(i, e) from None
        return results


class InProcessSession:
    """A broker's session with an `InProcessZooKeeper`: a `MetadataStore`."""

    def __init__(self, server: InProcessZooKeeper, session_timeout_ms: int) -> None:
        self._server = server
        self._timeout_ms = session_timeout_ms
        self._session_id = 0
        self._state = SessionState.LOST
        self._listeners: list[StateListener] = []
        self.missed: list[tuple[Watcher, WatchEvent, str]] = []  # while suspended

    @property
    def session_id(self) -> int:
        return self._session_id

    @property
    def session_timeout_ms(self) -> int:
        return self._timeout_ms

    async def start(self) -> None:
        self._session_id = self._server._open_session(self)
        self._state = SessionState.CONNECTED

    async def close(self) -> None:
        if self._session_id:
            session_id, self._session_id = self._session_id, 0
            self._state = SessionState.LOST
            await self._server._end_session(session_id)

    def add_state_listener(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    def _notify(self, state: SessionState) -> None:
        self._state = state
        for listener in list(self._listeners):
            listener(state)

    # Faults on demand ----------------------------------------------------------------

    async def expire(self) -> None:
        """The session expires now: its ephemerals go; LOST, then CONNECTED anew."""
        await self._server._end_session(self._session_id)
        self._notify(SessionState.LOST)
        self._session_id = self._server._open_session(self)
        self._notify(SessionState.CONNECTED)

    def suspend(self) -> None:
        """Lose the service: SUSPENDED; the service expires the session after its timeout."""
        self._server._expire_later(self._session_id, self._timeout_ms)
        self._notify(SessionState.SUSPENDED)

    def abandon(self) -> None:
        """The client crashed: it stops heartbeating without closing the session, so the
        service expires it (its ephemerals go) after the session timeout, as ZooKeeper
        does. Every later call fails with SessionExpiredError; no listener is told."""
        if self._session_id:
            session_id, self._session_id = self._session_id, 0
            self._listeners.clear()
            self._server._expire_later(session_id, self._timeout_ms)

    async def resume(self) -> None:
        """Reach the service again: CONNECTED if the session lived, else LOST then CONNECTED."""
        timer = self._server._expiry_timers.pop(self._session_id, None)
        missed, self.missed = self.missed, []
        if timer is not None:
            timer.cancel()
            self._notify(SessionState.CONNECTED)
            for watcher, event, path in missed:
                watcher(event, path)
            return
        self._notify(SessionState.LOST)
        self._session_id = self._server._open_session(self)
        self._notify(SessionState.CONNECTED)

    # MetadataStore -------------------------------------------------------------------

    def _live(self, path: str) -> int:
        if self._state == SessionState.SUSPENDED:
            raise ConnectionLossError(path)
        if not self._session_id or not self._server._is_live(self._session_id):
            raise SessionExpiredError(path)
        return self._session_id

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        owner = self._live(path)
        server = self._server

        def apply(batch: _Batch) -> str:
            if make_parents:
                missing = []
                parent = parent_of(path)
                while parent not in server._tree:
                    missing.append(parent)
                    parent = parent_of(parent)
                for p in reversed(missing):
                    server._create(batch, p, b"", 0, False)
            return server._create(batch, path, data, owner if ephemeral else 0, sequential)

        return str(await server.submit(owner, apply))

    async def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, Stat]:
        session_id = self._live(path)
        await self._server.read()
        znode = self._server.znode(path)
        if watch is not None:
            self._server.watch(path, session_id, watch, child=False)
        return znode.data, znode.stat()

    async def exists(self, path: str, watch: Watcher | None = None) -> Stat | None:
        session_id = self._live(path)
        await self._server.read()
        znode = self._server._tree.get(path)
        if watch is not None:
            self._server.watch(path, session_id, watch, child=False)
        return znode.stat() if znode is not None else None

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        session_id = self._live(path)
        await self._server.read()
        znode = self._server.znode(path)
        if watch is not None:
            self._server.watch(path, session_id, watch, child=True)
        return sorted(znode.children)

    async def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        session_id = self._live(path)
        server = self._server
        result = await server.submit(session_id, lambda b: server._set(b, path, data, version))
        assert isinstance(result, Stat)
        return result

    async def delete(self, path: str, version: int = -1) -> None:
        session_id = self._live(path)
        server = self._server
        await server.submit(session_id, lambda b: server._delete(b, path, version))

    async def multi(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        session_id = self._live(ops[0].path if ops else "/")
        server = self._server
        result = await server.submit(session_id, lambda b: server._multi(b, session_id, ops))
        assert isinstance(result, list)
        return result
