"""Kafka's config change notices, `/config/changes/config_change_<sequence>`.

A writer of an entity's configs (`/config/users/alice`, `/config/clients/app`, ...) then
creates a sequential notice `{"version":2,"entity_path":"users/alice"}`, as Kafka's
`AdminZkClient` does; every broker's `ConfigChangeListener` watches the notices and hands
the entity paths of new ones, in order, to its owner, which reads those entities again.

Kafka deletes notices older than 15 minutes by their creation time, which this store does
not give: a writer keeps the newest `KEPT_NOTICES` and deletes older ones. A listener that
finds notices gone between the last it handled and the oldest listed (it fell that far
behind), or whose session was lost (its watch with it), asks its owner to read
everything again (None instead of paths).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.store import (
    ConnectionLossError,
    MetadataStore,
    NoNodeError,
    SessionExpiredError,
    SessionState,
    WatchEvent,
)

log = logging.getLogger(__name__)

PREFIX = "config_change_"
KEPT_NOTICES = 1000
# Called with the entity paths of new notices in order, or None: read everything again.
ChangeHandler = Callable[[list[str] | None], Awaitable[None]]


def encode_notice(entity_path: str) -> bytes:
    return json.dumps({"version": 2, "entity_path": entity_path}).encode()


def decode_notice(data: bytes) -> str:
    """The entity path of a notice (version 2); ValueError for anything else."""
    try:
        notice = json.loads(data)
        path = notice["entity_path"] if notice.get("version") == 2 else None
    except (ValueError, KeyError, TypeError, AttributeError):
        path = None
    if not isinstance(path, str) or not path:
        raise ValueError(f"not a version 2 config change notice: {data[:200]!r}")
    return path


def _sequence(name: str) -> int:
    return int(name.removeprefix(PREFIX)) if name.startswith(PREFIX) else -1


async def notify_change(store: MetadataStore, entity_path: str) -> None:
    """Tell every broker that `entity_path`'s configs changed; drop notices past the kept."""
    await store.create(f"{zk.CONFIG_CHANGES}/{PREFIX}", encode_notice(entity_path), sequential=True)
    names = sorted(
        (n for n in await store.children(zk.CONFIG_CHANGES) if _sequence(n) >= 0), key=_sequence
    )
    for name in names[: max(len(names) - KEPT_NOTICES, 0)]:
        try:
            await store.delete(f"{zk.CONFIG_CHANGES}/{name}")
        except NoNodeError:
            pass  # another writer deleted it


class ConfigChangeListener:
    """Follows the notices for one owner, in a task it owns (`start`, `close`)."""

    def __init__(self, store: MetadataStore, handler: ChangeHandler) -> None:
        self.store = store
        self.handler = handler
        self._last = -1  # the sequence of the newest notice handled (or seen at start)
        self._wake = asyncio.Event()
        self._resync = False
        self._session_lost = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Note the newest notice, so the owner's full read after this misses nothing, then
        follow new ones."""
        self.store.add_state_listener(self._on_session_state)
        self._last = max(map(_sequence, await self._list()), default=-1)
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="config-changes")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _on_session_state(self, state: SessionState) -> None:
        if state == SessionState.LOST:
            self._session_lost = True
        elif state == SessionState.CONNECTED and self._session_lost:
            self._session_lost = False
            self._resync = True
            self._wake.set()

    def _fired(self, _event: WatchEvent, _path: str) -> None:
        self._wake.set()

    async def _list(self) -> list[str]:
        return await self.store.children(zk.CONFIG_CHANGES, self._fired)

    async def _follow(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._handle_new()
            except (ConnectionLossError, SessionExpiredError) as e:
                # The session's return (or a new one) wakes this again.
                log.info("config change notices postponed: %s", e)
            except Exception:
                # Not a store outage: logged; everything is read again at the next notice.
                log.exception("handling config change notices failed")
                self._resync = True

    async def _handle_new(self) -> None:
        names = await self._list()
        new = sorted((n for n in names if _sequence(n) > self._last), key=_sequence)
        # Invariant: every notice after `_last` is handled, or everything is read again. A
        # writer deletes only the oldest notices: while `_last`'s is listed, none after it
        # was missed (sequence numbers have gaps: ZooKeeper counts deletions too).
        if self._last >= 0:
            missed = f"{PREFIX}{self._last:010d}" not in names
        else:
            missed = len(names) >= KEPT_NOTICES
        if new:
            self._last = _sequence(new[-1])
        if self._resync or missed:
            self._resync = False
            await self.handler(None)
            return
        paths = []
        for name in new:
            try:
                data, _ = await self.store.get(f"{zk.CONFIG_CHANGES}/{name}")
                paths.append(decode_notice(data))
            except NoNodeError:
                pass  # purged by a writer since the listing: what it named changed again
            except ValueError as e:
                log.warning("ignoring config change notice %s: %s", name, e)
        if paths:
            await self.handler(paths)
