"""`ScramCredentialStore`: SCRAM credentials in the metadata store, as Kafka keeps them in
ZooKeeper, and every broker's view of them.

`/config/users/<sanitized user>` = `{"version":1,"config":{"SCRAM-SHA-256":"salt=...,
stored_key=...,server_key=...,iterations=4096"}}`. The same znode holds the user's client
quotas: a write reads it, changes only the SCRAM keys and writes it back conditionally on
its version (again on a conflict), then leaves a change notice (`config_changes`). Every
broker reads all users at start, then the users the notices name, so a change is in force
everywhere within a notice's round trip, and at once on the broker that wrote it.
Lookups are dict reads on the event loop; not shared across event loops.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.config_changes import ConfigChangeListener, notify_change
from tierbroker.broker.metadata.store import (
    CONFLICT_ATTEMPTS,
    BadVersionError,
    MetadataStore,
    NodeExistsError,
    NoNodeError,
    StoreError,
    gather_bounded,
)
from tierbroker.broker.security.sasl.scram import ScramCredential, ScramMechanism

log = logging.getLogger(__name__)

Credentials = dict[ScramMechanism, ScramCredential]


class ConcurrentChangeError(StoreError):
    """Another writer changed the user's znode every time this one tried."""


def user_path(user: str) -> str:
    return f"{zk.USER_CONFIGS}/{zk.sanitize(user)}"


def credentials_of(user: str, configs: Mapping[str, str]) -> Credentials:
    """The SCRAM credentials among a user's configs (quotas and others left out)."""
    found: Credentials = {}
    for mechanism in ScramMechanism:
        text = configs.get(mechanism.mechanism_name)
        if text is None:
            continue
        try:
            found[mechanism] = ScramCredential.decode(text)
        except ValueError as e:
            log.warning("ignoring the %s credential of %r: %s", mechanism.mechanism_name, user, e)
    return found


async def read_credentials(store: MetadataStore, user: str) -> Credentials:
    try:
        data, _ = await store.get(user_path(user))
    except NoNodeError:
        return {}
    return credentials_of(user, zk.decode_config(data) if data else {})


async def alter_credentials(
    store: MetadataStore, user: str, changes: Mapping[ScramMechanism, ScramCredential | None]
) -> None:
    """Set (a credential) or delete (None) `user`'s credentials of some mechanisms, leaving
    the znode's other configs; then leave a change notice. Raises StoreError."""
    path = user_path(user)
    for _ in range(CONFLICT_ATTEMPTS):
        if await _write(store, path, changes):
            break
    else:
        raise ConcurrentChangeError(path, "changed concurrently, try again")
    await notify_change(store, f"users/{zk.sanitize(user)}")


async def _write(
    store: MetadataStore, path: str, changes: Mapping[ScramMechanism, ScramCredential | None]
) -> bool:
    """One read-modify-write; False if another writer came between."""
    try:
        data, stat = await store.get(path)
        configs = zk.decode_config(data) if data else {}
    except NoNodeError:
        configs, stat = {}, None
    updated = dict(configs)
    for mechanism, credential in changes.items():
        if credential is None:
            updated.pop(mechanism.mechanism_name, None)
        else:
            updated[mechanism.mechanism_name] = credential.encode()
    if updated == configs:
        return True
    try:
        if stat is None:
            await store.create(path, zk.encode_config(updated), make_parents=True)
        else:
            await store.set(path, zk.encode_config(updated), stat.version)
    except (BadVersionError, NodeExistsError):
        return False
    return True


class ScramCredentialStore:
    """Every user's SCRAM credentials (`lookup`), and their writer (`alter`)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.users: dict[str, Credentials] = {}
        self._listener = ConfigChangeListener(store, self._on_changes)

    async def start(self) -> None:
        await self._listener.start()
        await self._read_all()

    async def close(self) -> None:
        await self._listener.close()

    def lookup(self, mechanism: ScramMechanism, user: str) -> ScramCredential | None:
        return self.users.get(user, {}).get(mechanism)

    async def alter(
        self, user: str, changes: Mapping[ScramMechanism, ScramCredential | None]
    ) -> None:
        """As `alter_credentials`, and in force on this broker when it returns."""
        await alter_credentials(self.store, user, changes)
        await self._read_user(user)

    async def _on_changes(self, paths: list[str] | None) -> None:
        if paths is None:
            await self._read_all()
            return
        for path in dict.fromkeys(paths):
            parts = path.strip("/").split("/")
            if len(parts) == 2 and parts[0] == "users":
                await self._read_user(zk.desanitize(parts[1]))

    async def _read_user(self, user: str) -> None:
        try:
            credentials = await read_credentials(self.store, user)
        except zk.UNDECODABLE as e:
            log.warning("ignoring the configs of user %r: %s", user, e)
            credentials = {}
        if credentials:
            self.users[user] = credentials
        else:
            self.users.pop(user, None)

    async def _read_all(self) -> None:
        """Every user's credentials, read again; the view replaced at once."""
        found: dict[str, Credentials] = {}

        async def read(user: str) -> None:
            try:
                credentials = await read_credentials(self.store, user)
            except zk.UNDECODABLE as e:
                log.warning("ignoring the configs of user %r: %s", user, e)
                return
            if credentials:
                found[user] = credentials

        try:
            names = await self.store.children(zk.USER_CONFIGS)
        except NoNodeError:
            names = []
        await gather_bounded(read(zk.desanitize(n)) for n in names)
        self.users = found
