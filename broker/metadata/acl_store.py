"""`AclStore`: the cluster's ACLs in the metadata store, followed into this broker's `AclCache`.

Layout and JSON are Kafka's (`zk_acls`). Reading: every resource znode is read at start
with a data watch, and each type's folder with a child watch; a watch that fires marks
what it watched stale, and one task owned here reads stale znodes again in the order they
fired, so another broker's change is seen within the store's notification latency. After
the session is lost every watch is gone, and everything is read again.

Writing (`update`): read the pattern's znode and its version, compute the new entries, and
write them only at that version (create if absent, delete when none remain); a concurrent
write by another broker makes the write fail, and it is read and decided again, so two
brokers adding ACLs to one pattern at once both land. A change notice follows each write.
Not shared across event loops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeAlias

from tierbroker.broker.metadata import zk_acls as zk
from tierbroker.broker.metadata.store import (
    CONFLICT_ATTEMPTS,
    BadVersionError,
    ConnectionLossError,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
    SessionState,
    StoreError,
    WatchEvent,
    gather_bounded,
)
from tierbroker.broker.metadata.zk_data import UNDECODABLE
from tierbroker.broker.security.authorizer.acl import PatternType, ResourcePattern, ResourceType
from tierbroker.broker.security.authorizer.acl_cache import AclCache, Entries

log = logging.getLogger(__name__)

STORED_PATTERN_TYPES = (PatternType.LITERAL, PatternType.PREFIXED)
STORED_RESOURCE_TYPES = tuple(t for t in ResourceType if t.value > 1)
NOTICES_KEPT = 100  # change notices left for Kafka's tools; older ones are deleted

# What a watch marks stale: everything (READ_ALL), a type's folder, or a pattern's znode.
_Stale: TypeAlias = str | tuple[PatternType, ResourceType] | ResourcePattern
READ_ALL = "all"


class AclConflictError(Exception):
    """A pattern's znode kept changing under a write (`CONFLICT_ATTEMPTS` times)."""


class AclStore:
    def __init__(self, store: MetadataStore, cache: AclCache) -> None:
        self.store = store
        self.cache = cache
        self._stale: dict[_Stale, None] = {}  # an ordered set
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._resync = False

    async def start(self) -> None:
        """Create the layout's folders, read every ACL, then follow changes in a task."""
        for folder in (zk.LITERAL_CHANGES, zk.EXTENDED_CHANGES):
            await self._ensure(folder)
        for pattern_type in STORED_PATTERN_TYPES:
            for resource_type in STORED_RESOURCE_TYPES:
                await self._ensure(zk.type_path(pattern_type, resource_type))
        self.store.add_state_listener(self._on_session_state)
        await self._read_all()
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="acl-store")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def update(
        self, pattern: ResourcePattern, change: Callable[[Entries], Entries]
    ) -> tuple[Entries, Entries]:
        """Write `change(current)` as the ACLs of `pattern`, at the version read; returns
        (before, after). Raises the store's errors, or AclConflictError."""
        path = zk.resource_path(pattern)
        for _ in range(CONFLICT_ATTEMPTS):
            try:
                data, stat = await self.store.get(path)
                version, current = stat.version, zk.decode_acls(data)
            except NoNodeError:
                version, current = -1, frozenset()
            wanted = change(current)
            if wanted == current:
                self.cache.replace(pattern, current)
                self._mark(pattern)
                return current, current
            try:
                if not wanted:
                    await self.store.delete(path, version)
                elif version < 0:
                    await self.store.create(path, zk.encode_acls(wanted), make_parents=True)
                else:
                    await self.store.set(path, zk.encode_acls(wanted), version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue  # written meanwhile by another broker: read and decide again
            self.cache.replace(pattern, wanted)
            self._mark(pattern)  # read again by the follower, which arms its watch
            await self._notify(pattern)
            return current, wanted
        raise AclConflictError(f"{path}: changed concurrently {CONFLICT_ATTEMPTS} times")

    async def read(self, pattern: ResourcePattern) -> Entries:
        """The ACLs of `pattern` as the store holds them now (not only as seen here)."""
        try:
            data, _ = await self.store.get(zk.resource_path(pattern))
        except NoNodeError:
            return frozenset()
        return zk.decode_acls(data)

    async def _notify(self, pattern: ResourcePattern) -> None:
        """Kafka's change notice of `pattern`, and the oldest notices beyond the newest
        `NOTICES_KEPT` deleted. The change is stored already and tierbroker's brokers
        follow the ACL znodes themselves: a failure here is logged, not raised."""
        prefix, data = zk.change_notice(pattern)
        folder = prefix.rsplit("/", 1)[0]
        try:
            await self.store.create(prefix, data, sequential=True, make_parents=True)
            notices = await self.store.children(folder)
            for name in sorted(notices)[:-NOTICES_KEPT]:
                try:
                    await self.store.delete(f"{folder}/{name}")
                except NoNodeError:
                    pass  # deleted by another broker's write
        except StoreError as e:
            log.warning("ACL change notice of %s not written under %s: %s", pattern, folder, e)

    async def _ensure(self, path: str) -> None:
        try:
            await self.store.create(path, make_parents=True)
        except NodeExistsError:
            pass

    # Following the store ---------------------------------------------------------------

    def _on_session_state(self, state: SessionState) -> None:
        if state == SessionState.LOST:
            self._resync = True
        elif state == SessionState.CONNECTED and self._resync:
            self._resync = False
            self._mark(READ_ALL)

    def _watch(self, key: _Stale) -> Callable[[WatchEvent, str], None]:
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
                await self._refresh(stale)
            except (ConnectionLossError, SessionExpiredError) as e:
                log.info("ACL refresh postponed: %s", e)
                for key in stale:
                    self._stale.setdefault(key, None)
            except Exception:
                log.exception("ACL refresh failed; read again at the next change")
                for key in stale:
                    self._stale.setdefault(key, None)

    async def _refresh(self, stale: list[_Stale]) -> None:
        if READ_ALL in stale:
            await self._read_all()
            return
        for key in stale:
            if isinstance(key, ResourcePattern):
                await self._read_pattern(key)
            elif isinstance(key, tuple):
                await self._read_type(*key)

    async def _read_all(self) -> None:
        seen: set[ResourcePattern] = set()
        for pattern_type in STORED_PATTERN_TYPES:
            for resource_type in STORED_RESOURCE_TYPES:
                seen.update(await self._read_type(pattern_type, resource_type, reread=True))
        for gone in set(self.cache.patterns()) - seen:
            self.cache.replace(gone, frozenset())

    async def _read_type(
        self, pattern_type: PatternType, resource_type: ResourceType, reread: bool = False
    ) -> set[ResourcePattern]:
        """Read the patterns of a type folder that are new here (`reread`: all of them, which
        arms their watches again); forget those gone. Returns the patterns listed."""
        key = (pattern_type, resource_type)
        try:
            names = await self.store.children(
                zk.type_path(pattern_type, resource_type), self._watch(key)
            )
        except NoNodeError:
            names = []  # removed by hand: nothing of this type until it is written again
        listed = {ResourcePattern(resource_type, n, pattern_type) for n in names}
        known = {
            p
            for p, _ in self.cache.patterns_of_type(resource_type)
            if p.pattern_type == pattern_type
        }
        for gone in known - listed:
            self.cache.replace(gone, frozenset())
        await gather_bounded(self._read_pattern(p) for p in (listed if reread else listed - known))
        return listed

    async def _read_pattern(self, pattern: ResourcePattern) -> None:
        path = zk.resource_path(pattern)
        try:
            data, _ = await self.store.get(path, self._watch(pattern))
        except NoNodeError:
            self.cache.replace(pattern, frozenset())
            return
        try:
            self.cache.replace(pattern, zk.decode_acls(data))
        except UNDECODABLE as e:
            log.error("ACL znode %s does not decode, its ACLs are left as they were: %r", path, e)
