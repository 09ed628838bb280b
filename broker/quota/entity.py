"""Quota entities and the quotas set on them, with Kafka's order of precedence.

An entity is a user, a client id, or both (Kafka's `ClientQuotaEntity`), each either a
name or the default entity (`<default>` in the store, a null name on the wire). A
client's quota of one kind comes from the first entity, in this order, that sets that
kind (Kafka's `ClientQuotaManager`):

    1. users/<user>/clients/<client-id>    5. users/<default>/clients/<default>
    2. users/<user>/clients/<default>      6. users/<default>
    3. users/<user>                        7. clients/<client-id>
    4. users/<default>/clients/<client-id> 8. clients/<default>

The user is the principal's name. A client with an empty client id matches only the
user entities (3 and 6), as Kafka's lookup does. Clients that resolve to the same entity
share one rate when it names them (`users/alice` is one quota for all of alice's
clients) and have one each when it is a default (`clients/<default>`: every client id its
own): the entity's `tags` for a client.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from tierbroker.broker.metadata.zk_data import desanitize, sanitize

USER = "user"
CLIENT_ID = "client-id"
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
# Kafka's quota keys of user and client-id entities that this broker enforces, and
# whether each is integral (Kafka's LONG) or not (DOUBLE).
QUOTA_KEYS: Final[Mapping[str, bool]] = {
    PRODUCER_BYTE_RATE: True,
    CONSUMER_BYTE_RATE: True,
    REQUEST_PERCENTAGE: False,
}


class Default(enum.Enum):
    """The default entity of a kind: `<default>` in the store, a null name on the wire."""

    DEFAULT = "<default>"


DEFAULT: Final = Default.DEFAULT
Name = str | Default


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """A user, a client id, or both (None: not part of the entity)."""

    user: Name | None = None
    client_id: Name | None = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise ValueError("a quota entity names a user, a client id, or both")

    def parts(self) -> list[tuple[str, str | None]]:
        """(entity type, name or None for the default), as the protocol lists them."""
        return [
            (kind, None if name is DEFAULT else str(name))
            for kind, name in ((USER, self.user), (CLIENT_ID, self.client_id))
            if name is not None
        ]

    def tags(self, user: str, client_id: str) -> tuple[str, str]:
        """The (user, client id) whose rate a client matched to this entity counts in."""
        return (
            user if self.user is not None else "",
            client_id if self.client_id is not None else "",
        )

    def __str__(self) -> str:
        return ", ".join(f"{kind}={'<default>' if n is None else n}" for kind, n in self.parts())


def precedence(user: str, client_id: str) -> Iterator[QuotaEntity]:
    """The entities a client's quota may come from, first match wins."""
    if client_id:
        yield QuotaEntity(user, client_id)
        yield QuotaEntity(user, DEFAULT)
    yield QuotaEntity(user)
    if client_id:
        yield QuotaEntity(DEFAULT, client_id)
        yield QuotaEntity(DEFAULT, DEFAULT)
    yield QuotaEntity(DEFAULT)
    if client_id:
        yield QuotaEntity(None, client_id)
        yield QuotaEntity(None, DEFAULT)


@dataclass(frozen=True, slots=True)
class ResolvedQuota:
    bound: float
    entity: QuotaEntity
    tags: tuple[str, str]


class ClientQuotas:
    """Every entity's quotas; a dict lookup per level of precedence. Replaced whole on a
    change (`with_entity`), so a reader never sees half of one."""

    def __init__(self, quotas: Mapping[QuotaEntity, Mapping[str, float]] | None = None) -> None:
        self.quotas: dict[QuotaEntity, Mapping[str, float]] = {
            e: dict(q) for e, q in (quotas or {}).items() if q
        }

    def with_entity(self, entity: QuotaEntity, quotas: Mapping[str, float]) -> ClientQuotas:
        """These quotas with `entity`'s replaced (none: removed)."""
        changed = dict(self.quotas)
        changed[entity] = quotas
        return ClientQuotas(changed)

    def resolve(self, key: str, user: str, client_id: str) -> ResolvedQuota | None:
        """The quota of kind `key` for this client, or None if no entity sets one."""
        if not self.quotas:
            return None
        for entity in precedence(user, client_id):
            quotas = self.quotas.get(entity)
            if quotas is not None and (bound := quotas.get(key)) is not None:
                return ResolvedQuota(bound, entity, entity.tags(user, client_id))
        return None

    def __bool__(self) -> bool:
        return bool(self.quotas)


def znode_name(name: Name) -> str:
    return DEFAULT.value if name is DEFAULT else sanitize(str(name))


def name_of(znode: str) -> Name:
    return DEFAULT if znode == DEFAULT.value else desanitize(znode)
