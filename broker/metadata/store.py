"""`MetadataStore`: the coordination service the cluster's metadata lives in, with ZooKeeper's API.

A tree of znodes, each with bytes and a version; ephemeral znodes that live as long as
the session that made them; one-shot watches; conditional writes (`version`) and atomic
`multi`. Two implementations: `InProcessZooKeeper` sessions (brokers in one process,
the embedded default) and `ZooKeeperStore` (kazoo, a real ZooKeeper). The controller and
brokers cannot tell them apart: they see the same errors, session states and watch events.

Every method is a coroutine run on the event loop; watch callbacks and session-state
listeners are called on the event loop too, and must not block.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

READ_CONCURRENCY = 256  # znode reads in flight at once
OPS_PER_MULTI = 400  # ZooKeeper bounds one request (jute.maxbuffer, 1 MiB)
CONFLICT_ATTEMPTS = 10  # reads and decisions again after a concurrent change of a znode


class StoreError(Exception):
    """A store operation failed; subclasses name ZooKeeper's error."""

    def __init__(self, path: str, message: str = "") -> None:
        super().__init__(f"{path}: {message or type(self).__name__}")
        self.path = path


class NoNodeError(StoreError):
    """The znode (or, for a create, its parent) does not exist."""


class NodeExistsError(StoreError):
    """A create of a znode that exists."""


class BadVersionError(StoreError):
    """A conditional write whose expected version is not the znode's."""


class NotEmptyError(StoreError):
    """A delete of a znode that has children."""


class ConnectionLossError(StoreError):
    """The service did not answer; the operation may or may not have been applied."""


class SessionExpiredError(StoreError):
    """The session is gone, and its ephemeral znodes with it."""


class MultiError(StoreError):
    """A `multi` applied nothing: `error` is what its `index`-th operation met."""

    def __init__(self, index: int, error: StoreError) -> None:
        super().__init__(error.path, f"operation {index} of a multi failed: {error}")
        self.index = index
        self.error = error


@dataclass(frozen=True, slots=True)
class Stat:
    version: int  # data changes since creation
    czxid: int  # the transaction that created the znode (Kafka's broker epoch)
    ephemeral_owner: int  # the owning session's id, 0 for a persistent znode
    num_children: int = 0


class WatchEvent(Enum):
    CREATED = "created"
    DELETED = "deleted"
    CHANGED = "changed"
    CHILD = "child"


class SessionState(Enum):
    """As kazoo reports them: SUSPENDED (disconnected, the session may live on), LOST (the
    session expired: ephemerals and watches are gone), CONNECTED (again, or anew after LOST)."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


Watcher = Callable[[WatchEvent, str], None]
StateListener = Callable[[SessionState], None]


@dataclass(frozen=True, slots=True)
class Check:
    path: str
    version: int


@dataclass(frozen=True, slots=True)
class Create:
    path: str
    data: bytes = b""
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class SetData:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class Delete:
    path: str
    version: int = -1


Op = Check | Create | SetData | Delete


class MetadataStore(Protocol):
    @property
    def session_id(self) -> int: ...

    @property
    def session_timeout_ms(self) -> int: ...

    async def start(self) -> None:
        """Connect and open a session; raises ConnectionLossError if the service is not there."""

    async def close(self) -> None:
        """End the session (its ephemerals go at once); idempotent."""

    def add_state_listener(self, listener: StateListener) -> None: ...

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        """Create a znode; returns its path (with the sequence number if `sequential`)."""

    async def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, Stat]:
        """Data and stat; `watch` fires once on the next change or deletion."""

    async def exists(self, path: str, watch: Watcher | None = None) -> Stat | None:
        """Stat or None; `watch` fires once on creation, change or deletion."""

    async def children(self, path: str, watch: Watcher | None = None) -> list[str]:
        """Child names, sorted; `watch` fires once when a child is added or removed, or
        the znode is deleted."""

    async def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        """Replace the data if the version matches (-1: any)."""

    async def delete(self, path: str, version: int = -1) -> None: ...

    async def multi(self, ops: Sequence[Op]) -> list[str | Stat | None]:
        """Apply every op or none (MultiError); per op: the created path, the new stat, or None."""


def parent_of(path: str) -> str:
    parent = path.rsplit("/", 1)[0]
    return parent or "/"


def join(*parts: str | int) -> str:
    return "/" + "/".join(str(p).strip("/") for p in parts if str(p).strip("/"))


async def put(store: MetadataStore, path: str, data: bytes) -> None:
    """Set `path` to `data`, creating it (and its parents) if it does not exist."""
    try:
        await store.set(path, data)
    except NoNodeError:
        await store.create(path, data, make_parents=True)


async def gather_bounded(reads: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run the read coroutines, at most `READ_CONCURRENCY` at a time (a store serves them
    pipelined); the first error wins."""
    pending: list[Coroutine[Any, Any, None]] = []
    for read in reads:
        pending.append(read)
        if len(pending) >= READ_CONCURRENCY:
            await asyncio.gather(*pending)
            pending = []
    if pending:
        await asyncio.gather(*pending)
