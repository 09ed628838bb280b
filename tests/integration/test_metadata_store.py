"""The MetadataStore contract, held by both implementations: the in-process service and a
real ZooKeeper (Debian's package, one per module; each test in its own chroot)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.zookeeper import BlackHoleProxy, ZooKeeperServer
from tierbroker.broker.metadata.inprocess_store import InProcessSession, InProcessZooKeeper
from tierbroker.broker.metadata.store import (
    BadVersionError,
    Check,
    ConnectionLossError,
    Create,
    MetadataStore,
    MultiError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    SessionState,
    SetData,
    WatchEvent,
)
from tierbroker.broker.metadata.zk_store import ZooKeeperStore

_chroots = itertools.count()


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zk")).start()
    yield server
    server.stop()


class Stores:
    """Opens sessions on one service of the kind under test."""

    def __init__(self, kind: str, zookeeper: ZooKeeperServer | None, tmp_path: Path) -> None:
        self.kind = kind
        self.zookeeper = zookeeper
        self.chroot = f"/test-{next(_chroots)}"
        self.server = InProcessZooKeeper(tmp_path / "metadata.db") if kind == "inprocess" else None
        self.opened: list[MetadataStore] = []

    async def open(
        self, session_timeout_ms: int = 4000, connect: str | None = None
    ) -> MetadataStore:
        if self.server is not None:
            store: MetadataStore = self.server.session(session_timeout_ms)
        else:
            assert self.zookeeper is not None
            store = ZooKeeperStore(
                (connect or self.zookeeper.connect) + self.chroot, session_timeout_ms
            )
        await store.start()
        self.opened.append(store)
        return store

    async def close(self) -> None:
        for store in self.opened:
            await store.close()
        if self.server is not None:
            await self.server.close()


@pytest.fixture(params=["inprocess", "zookeeper"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    zookeeper = request.getfixturevalue("zookeeper") if request.param == "zookeeper" else None
    stores = Stores(request.param, zookeeper, tmp_path)
    if stores.server is not None:
        await stores.server.open()
    yield stores
    await stores.close()


async def next_event(events: asyncio.Queue[tuple[WatchEvent, str]]) -> tuple[WatchEvent, str]:
    return await asyncio.wait_for(events.get(), 10)


async def test_create_get_set_delete_with_versions(stores: Stores) -> None:
    store = await stores.open()
    assert await store.create("/a/b", b"one", make_parents=True) == "/a/b"
    with pytest.raises(NodeExistsError):
        await store.create("/a/b", b"again")
    with pytest.raises(NoNodeError):
        await store.create("/missing/parent/c", b"")
    data, stat = await store.get("/a/b")
    assert (data, stat.version) == (b"one", 0)
    assert (await store.set("/a/b", b"two", version=0)).version == 1
    with pytest.raises(BadVersionError):
        await store.set("/a/b", b"stale", version=0)
    with pytest.raises(NotEmptyError):
        await store.delete("/a")
    with pytest.raises(BadVersionError):
        await store.delete("/a/b", version=0)
    await store.delete("/a/b", version=1)
    assert await store.exists("/a/b") is None
    assert await store.children("/a") == []


async def test_sequential_children_count_up(stores: Stores) -> None:
    store = await stores.open()
    await store.create("/seq", b"")
    first = await store.create("/seq/n-", b"", sequential=True)
    second = await store.create("/seq/n-", b"", sequential=True)
    assert first < second and first.startswith("/seq/n-") and len(first) == len("/seq/n-") + 10
    assert await store.children("/seq") == [first.rsplit("/", 1)[1], second.rsplit("/", 1)[1]]


async def test_ephemerals_go_with_their_session_and_watches_say_so(stores: Stores) -> None:
    owner = await stores.open()
    observer = await stores.open()
    await observer.create("/brokers/ids", b"", make_parents=True)
    events: asyncio.Queue[tuple[WatchEvent, str]] = asyncio.Queue()
    assert await observer.children("/brokers/ids", lambda e, p: events.put_nowait((e, p))) == []
    await owner.create("/brokers/ids/1", b"{}", ephemeral=True)
    assert await next_event(events) == (WatchEvent.CHILD, "/brokers/ids")
    _, stat = await observer.get("/brokers/ids/1", lambda e, p: events.put_nowait((e, p)))
    assert stat.ephemeral_owner == owner.session_id != 0
    assert stat.czxid > 0
    await owner.close()
    assert await next_event(events) == (WatchEvent.DELETED, "/brokers/ids/1")
    assert await observer.children("/brokers/ids") == []


async def test_watches_fire_once_per_registration(stores: Stores) -> None:
    store = await stores.open()
    events: asyncio.Queue[tuple[WatchEvent, str]] = asyncio.Queue()
    assert await store.exists("/w", lambda e, p: events.put_nowait((e, p))) is None
    await store.create("/w", b"1")
    assert await next_event(events) == (WatchEvent.CREATED, "/w")
    await store.get("/w", lambda e, p: events.put_nowait((e, p)))
    await store.set("/w", b"2")
    await store.set("/w", b"3")
    assert await next_event(events) == (WatchEvent.CHANGED, "/w")
    await asyncio.sleep(0.2)
    assert events.empty()  # the second change had no watch left


async def test_multi_applies_all_or_nothing(stores: Stores) -> None:
    store = await stores.open()
    await store.create("/controller_epoch", b"1")
    await store.create("/state", b"a")
    results = await store.multi(
        [Check("/controller_epoch", 0), SetData("/state", b"b", 0), Create("/new", b"x")]
    )
    assert results[0] is None and results[2] == "/new"
    with pytest.raises(MultiError) as failed:
        await store.multi(
            [Create("/other", b""), Check("/controller_epoch", 7), SetData("/state", b"c")]
        )
    assert failed.value.index == 1 and isinstance(failed.value.error, BadVersionError)
    assert await store.exists("/other") is None
    assert (await store.get("/state"))[0] == b"b"


async def test_a_failed_ephemeral_registration_is_seen_as_taken(stores: Stores) -> None:
    first = await stores.open()
    second = await stores.open()
    await first.create("/controller", b"1", ephemeral=True)
    with pytest.raises(NodeExistsError):
        await second.create("/controller", b"2", ephemeral=True)


async def test_persistent_znodes_survive_a_restart_of_the_in_process_service(
    tmp_path: Path,
) -> None:
    server = InProcessZooKeeper(tmp_path / "metadata.db")
    await server.open()
    store = server.session()
    await store.start()
    await store.create("/cluster/id", b"abc", make_parents=True)
    await store.set("/cluster/id", b"def")
    await store.create("/brokers/ids/0", b"", ephemeral=True, make_parents=True)
    czxid = (await store.get("/cluster/id"))[1].czxid
    await server.close()
    server = InProcessZooKeeper(tmp_path / "metadata.db")
    await server.open()
    store = server.session()
    await store.start()
    data, stat = await store.get("/cluster/id")
    assert (data, stat.version, stat.czxid) == (b"def", 1, czxid)
    assert await store.children("/brokers/ids") == []  # ephemerals died with the process
    created = await store.create("/brokers/ids/0", b"", ephemeral=True)
    assert (await store.get(created))[1].czxid > czxid  # transaction ids never repeat
    await server.close()


async def test_in_process_expiry_ends_the_session_and_starts_a_new_one(tmp_path: Path) -> None:
    server = InProcessZooKeeper(None)
    await server.open()
    store = server.session()
    await store.start()
    states: list[SessionState] = []
    store.add_state_listener(states.append)
    old = store.session_id
    await store.create("/e", b"", ephemeral=True)
    await store.expire()
    assert states == [SessionState.LOST, SessionState.CONNECTED]
    assert store.session_id != old
    assert await store.exists("/e") is None
    await server.close()


async def test_in_process_suspension_outliving_the_timeout_loses_the_session() -> None:
    server = InProcessZooKeeper(None)
    await server.open()
    suspended: InProcessSession = server.session(session_timeout_ms=200)
    observer = server.session()
    await suspended.start()
    await observer.start()
    await suspended.create("/e", b"", ephemeral=True)
    states: list[SessionState] = []
    suspended.add_state_listener(states.append)
    suspended.suspend()
    with pytest.raises(ConnectionLossError):
        await suspended.set("/e", b"x")
    gone = asyncio.Event()
    await observer.exists("/e", lambda e, p: gone.set())
    await asyncio.wait_for(gone.wait(), 10)
    await suspended.resume()
    assert states == [SessionState.SUSPENDED, SessionState.LOST, SessionState.CONNECTED]
    await server.close()


async def test_an_abandoned_in_process_session_expires_after_its_timeout() -> None:
    server = InProcessZooKeeper(None)
    await server.open()
    crashed: InProcessSession = server.session(session_timeout_ms=200)
    observer = server.session()
    await crashed.start()
    await observer.start()
    await crashed.create("/e", b"", ephemeral=True)
    states: list[SessionState] = []
    crashed.add_state_listener(states.append)
    crashed.abandon()
    assert await observer.exists("/e") is not None  # a crash is seen only at expiry
    with pytest.raises(SessionExpiredError):
        await crashed.set("/e", b"x")
    gone = asyncio.Event()
    await observer.exists("/e", lambda e, p: gone.set())
    await asyncio.wait_for(gone.wait(), 10)
    assert states == []  # nobody is left to tell
    await server.close()


async def test_closing_the_service_finishes_an_expiry_under_way() -> None:
    server = InProcessZooKeeper(None)
    await server.open()
    crashed = server.session(session_timeout_ms=0)
    await crashed.start()
    await crashed.create("/e", b"", ephemeral=True)
    crashed.abandon()
    expiring: list[asyncio.Task[object]] = []
    for _ in range(1000):  # the timer fires at once, on a later loop iteration
        expiring = [t for t in asyncio.all_tasks() if t.get_name() == "zk-expire"]
        if expiring:
            break
        await asyncio.sleep(0)
    assert expiring

    await server.close()

    assert expiring[0].done() and expiring[0].exception() is None


async def test_zookeeper_partition_longer_than_the_session_expires_it(
    zookeeper: ZooKeeperServer,
) -> None:
    proxy = BlackHoleProxy(zookeeper.port)
    partitioned = ZooKeeperStore(proxy.connect + "/partition-test", session_timeout_ms=2000)
    observer = ZooKeeperStore(zookeeper.connect + "/partition-test")
    await partitioned.start()
    await observer.start()
    states: list[SessionState] = []
    partitioned.add_state_listener(states.append)
    await partitioned.create("/e", b"", ephemeral=True)
    gone = asyncio.Event()
    await observer.exists("/e", lambda e, p: gone.set())
    proxy.black_hole()
    with pytest.raises((ConnectionLossError, SessionExpiredError)):
        await partitioned.set("/e", b"written during the partition")
    await asyncio.wait_for(gone.wait(), 20)
    proxy.heal()
    for _ in range(200):
        if SessionState.CONNECTED in states[states.index(SessionState.SUSPENDED) :]:
            break
        await asyncio.sleep(0.05)
    assert states[:1] == [SessionState.SUSPENDED]
    assert SessionState.LOST in states and states[-1] == SessionState.CONNECTED
    assert await partitioned.exists("/e") is None
    await partitioned.close()
    await observer.close()
    proxy.close()


async def test_a_zookeeper_watch_outlives_a_disconnection_the_session_survives(
    zookeeper: ZooKeeperServer,
) -> None:
    """kazoo drops its watches with the connection: the store fires each once connected
    again, so a change made meanwhile (or since) is not missed."""
    proxy = BlackHoleProxy(zookeeper.port)
    watching = ZooKeeperStore(proxy.connect + "/reconnect-test", session_timeout_ms=8000)
    writer = ZooKeeperStore(zookeeper.connect + "/reconnect-test")
    await watching.start()
    await writer.start()
    states: list[SessionState] = []
    watching.add_state_listener(states.append)
    await writer.create("/w", b"before")
    fired = asyncio.Event()
    await watching.get("/w", lambda e, p: fired.set())
    proxy.black_hole()
    for _ in range(200):
        if SessionState.SUSPENDED in states:
            break
        await asyncio.sleep(0.05)
    await writer.set("/w", b"while disconnected")
    proxy.heal()
    await asyncio.wait_for(fired.wait(), 20)
    assert SessionState.LOST not in states and states[-1] == SessionState.CONNECTED
    assert (await watching.get("/w"))[0] == b"while disconnected"
    await watching.close()
    await writer.close()
    proxy.close()
