"""`ClientQuotaStore`: client quotas in the metadata store, as Kafka keeps them in ZooKeeper.

`/config/users/<user>`, `/config/clients/<client-id>` and
`/config/users/<user>/clients/<client-id>` (`<default>` for a default entity, names
sanitized as Kafka's `Sanitizer` does), each `{"version":1,"config":{...}}`. A user's
znode holds its SCRAM credentials too: a write reads the znode, changes only the quota
keys and writes it back conditionally on its version, again on a conflict. Each write is
followed by a change notice (`config_changes`); every broker reads all quotas at start
and then the entities the notices name, so a change is in force everywhere within a
notice's round trip, and at once on the broker that wrote it.
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
from tierbroker.broker.metadata.topic_admin import store_error
from tierbroker.broker.quota.entity import (
    QUOTA_KEYS,
    ClientQuotas,
    QuotaEntity,
    name_of,
    znode_name,
)
from tierbroker.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)


def entity_path(entity: QuotaEntity) -> str:
    """`users/<user>`, `clients/<client-id>` or `users/<user>/clients/<client-id>`, as a
    change notice names it (the znode is under `/config/`)."""
    parts = []
    if entity.user is not None:
        parts += ["users", znode_name(entity.user)]
    if entity.client_id is not None:
        parts += ["clients", znode_name(entity.client_id)]
    return "/".join(parts)


def parse_entity_path(path: str) -> QuotaEntity | None:
    """The quota entity of a notice's path; None for another kind (topics, brokers)."""
    parts = path.strip("/").split("/")
    if len(parts) == 2 and parts[0] == "users":
        return QuotaEntity(name_of(parts[1]))
    if len(parts) == 2 and parts[0] == "clients":
        return QuotaEntity(None, name_of(parts[1]))
    if len(parts) == 4 and parts[0] == "users" and parts[2] == "clients":
        return QuotaEntity(name_of(parts[1]), name_of(parts[3]))
    return None


def _znode(entity: QuotaEntity) -> str:
    return f"/config/{entity_path(entity)}"


def format_quota(key: str, value: float) -> str:
    """As Kafka writes it: a LONG key as an integer, a DOUBLE as Java prints it (50.0)."""
    return str(int(value)) if QUOTA_KEYS[key] else repr(float(value))


def _configs(data: bytes) -> dict[str, str]:
    """A config znode's configs; none for a parent made empty by a child's creation."""
    return zk.decode_config(data) if data else {}


def quotas_of(entity: QuotaEntity, configs: Mapping[str, str]) -> dict[str, float]:
    """The quota keys of an entity's configs (SCRAM credentials and others left out)."""
    quotas = {}
    for key, text in configs.items():
        if key in QUOTA_KEYS:
            try:
                quotas[key] = float(text)
            except ValueError:
                log.warning("ignoring %s=%r of %s: not a number", key, text, entity)
    return quotas


class ClientQuotaStore:
    """This broker's view of every entity's quotas (`quotas`), and their writer."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.quotas = ClientQuotas()
        self._listener = ConfigChangeListener(store, self._on_changes)

    async def start(self) -> None:
        await self._listener.start()
        await self._read_all()

    async def close(self) -> None:
        await self._listener.close()

    async def alter(self, entity: QuotaEntity, changes: Mapping[str, float | None]) -> None:
        """Set (a value) or remove (None) quota keys of `entity`, leaving its other configs."""
        path = _znode(entity)
        try:
            for _ in range(CONFLICT_ATTEMPTS):
                if await self._write(path, changes):
                    break
            else:
                raise KafkaError(
                    ErrorCode.unknown_server_error, f"{path}: changed concurrently, try again"
                )
            await notify_change(self.store, entity_path(entity))
            await self._read_entity(entity)
        except StoreError as e:
            raise store_error(f"altering the quotas of {entity}", e) from e

    async def _write(self, path: str, changes: Mapping[str, float | None]) -> bool:
        """One read-modify-write; False if another writer came between."""
        try:
            data, stat = await self.store.get(path)
            configs = _configs(data)
        except NoNodeError:
            configs, stat = {}, None
        except zk.UNDECODABLE as e:  # written by another tool: not overwritten blindly
            raise KafkaError(
                ErrorCode.unknown_server_error, f"{path} holds configs that do not decode: {e}"
            ) from None
        updated = dict(configs)
        for key, value in changes.items():
            if value is None:
                updated.pop(key, None)
            else:
                updated[key] = format_quota(key, value)
        if updated == configs:
            return True
        try:
            if stat is None:
                await self.store.create(path, zk.encode_config(updated), make_parents=True)
            else:
                await self.store.set(path, zk.encode_config(updated), stat.version)
        except (BadVersionError, NodeExistsError):
            return False
        return True

    async def _on_changes(self, paths: list[str] | None) -> None:
        if paths is None:
            await self._read_all()
            return
        for path in dict.fromkeys(paths):
            entity = parse_entity_path(path)
            if entity is not None:
                await self._read_entity(entity)

    async def _read_entity(self, entity: QuotaEntity) -> None:
        try:
            data, _ = await self.store.get(_znode(entity))
            quotas = quotas_of(entity, _configs(data))
        except NoNodeError:
            quotas = {}
        except zk.UNDECODABLE as e:
            log.warning("ignoring the configs of %s: %s", entity, e)
            quotas = {}
        if quotas != self.quotas.quotas.get(entity, {}):
            log.info("client quotas of %s: %s", entity, quotas or "none")
        self.quotas = self.quotas.with_entity(entity, quotas)

    async def _read_all(self) -> None:
        """Every quota entity, read again; the view replaced at once."""
        found: dict[QuotaEntity, dict[str, float]] = {}

        async def read(entity: QuotaEntity) -> None:
            try:
                data, _ = await self.store.get(_znode(entity))
            except NoNodeError:
                return
            try:
                found[entity] = quotas_of(entity, _configs(data))
            except zk.UNDECODABLE as e:
                log.warning("ignoring the configs of %s: %s", entity, e)

        async def read_user(user: str) -> None:
            await read(QuotaEntity(name_of(user)))
            try:
                clients = await self.store.children(f"{zk.USER_CONFIGS}/{user}/clients")
            except NoNodeError:
                return
            await gather_bounded(read(QuotaEntity(name_of(user), name_of(c))) for c in clients)

        users = await self.store.children(zk.USER_CONFIGS)
        clients = await self.store.children(zk.CLIENT_CONFIGS)
        await gather_bounded(read_user(u) for u in users)
        await gather_bounded(read(QuotaEntity(None, name_of(c))) for c in clients)
        self.quotas = ClientQuotas(found)
