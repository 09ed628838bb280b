"""Kafka's ACL model: resource types, pattern types, operations, permissions (their int8
codes and names), ACL bindings, and the filters DescribeAcls and DeleteAcls match with.

Names are Kafka's twice over: the enum names (`TRANSACTIONAL_ID`, what the wire and
`kafka-acls` print) and the Pascal-case names ZooKeeper's layout and JSON hold
(`TransactionalId`, `DescribeConfigs`); `parse` reads either, in any case.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Self

WILDCARD = "*"  # a literal resource name matching every name; a host or principal name too
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource


class _AclEnum(IntEnum):
    @property
    def pascal_name(self) -> str:
        """As ZooKeeper's layout writes it: `TRANSACTIONAL_ID` -> `TransactionalId`."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @classmethod
    def parse(cls, text: str) -> Self:
        """From `TRANSACTIONAL_ID`, `TransactionalId` or `transactional-id`; ValueError else."""
        key = text.replace("_", "").replace("-", "").upper()
        for member in cls:
            if member.name.replace("_", "") == key:
                return member
        choices = ", ".join(m.name for m in cls if m.value > 1)
        raise ValueError(f"{text!r} is not a {cls.__name__} (one of {choices})")


class ResourceType(_AclEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(_AclEnum):
    UNKNOWN = 0
    ANY = 1  # filters only: LITERAL or PREFIXED, name compared as given
    MATCH = 2  # filters only: every pattern that would match the name
    LITERAL = 3
    PREFIXED = 4


class AclOperation(_AclEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(_AclEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# The operations each resource type has (Kafka's `AclEntry.supportedOperations`): what an
# ACL may grant on it, and what KIP-430's authorized operations are asked of.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (
        AclOperation.READ,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.CLUSTER: (
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
    ResourceType.DELEGATION_TOKEN: (AclOperation.DESCRIBE,),
    ResourceType.USER: (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS),
}


def _known(value: IntEnum) -> bool:
    return value.value > 1  # neither UNKNOWN nor ANY


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType

    def __str__(self) -> str:
        return f"{self.resource_type.pascal_name}:{self.pattern_type.name}:{self.name}"


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    principal: str  # `Type:name`, or `User:*`
    host: str  # an IP address, or `*`
    operation: AclOperation
    permission_type: AclPermissionType


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    def invalid_reason(self) -> str | None:
        """Why an ACL of this binding cannot be created (Kafka's AclControlManager
        `validateNewAcl`, and AclApis' rule for the cluster's name); None if it can."""
        pattern, entry = self.pattern, self.entry
        if not _known(pattern.resource_type):
            return f"Invalid resourceType {pattern.resource_type.name}"
        if pattern.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            return f"Invalid patternType {pattern.pattern_type.name}"
        if not _known(entry.operation):
            return f"Invalid operation {entry.operation.name}"
        if not _known(entry.permission_type):
            return f"Invalid permissionType {entry.permission_type.name}"
        if not pattern.name:
            return "Resource name should not be empty"
        if pattern.resource_type == ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
            return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        principal_type, _, principal_name = entry.principal.partition(":")
        if not principal_type or not principal_name:
            return (
                f"Could not parse principal from `{entry.principal}` (expected Type:name, "
                "e.g. User:alice)"
            )
        if "/" in pattern.name:
            return f"Resource name {pattern.name!r} holds a '/', which the ACL store cannot keep"
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class AclBindingFilter:
    """What DescribeAcls and DeleteAcls select: None (a name, principal or host) and ANY
    match everything; pattern type MATCH selects every pattern that applies to the name
    (the literal name, the literal `*`, and prefixes of it), Kafka's `ResourcePatternFilter`
    and `AccessControlEntryFilter`."""

    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: AclOperation
    permission_type: AclPermissionType

    def invalid_reason(self) -> str | None:
        """Why Kafka refuses the filter (INVALID_REQUEST): a field that is UNKNOWN."""
        fields = (self.resource_type, self.pattern_type, self.operation, self.permission_type)
        unknown = [type(f).__name__ for f in fields if f.value == 0]
        return f"Filter contains UNKNOWN elements: {', '.join(unknown)}" if unknown else None

    def matches_pattern(self, pattern: ResourcePattern) -> bool:
        if self.resource_type not in (ResourceType.ANY, pattern.resource_type):
            return False
        wanted = self.pattern_type
        if wanted not in (PatternType.ANY, PatternType.MATCH, pattern.pattern_type):
            return False
        if self.name is None:
            return True
        if wanted in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        if pattern.pattern_type == PatternType.LITERAL:  # MATCH from here on
            return self.name == pattern.name or pattern.name == WILDCARD
        return self.name.startswith(pattern.name)

    def matches_entry(self, entry: AccessControlEntry) -> bool:
        return (
            (self.principal is None or self.principal == entry.principal)
            and (self.host is None or self.host == entry.host)
            and self.operation in (AclOperation.ANY, entry.operation)
            and self.permission_type in (AclPermissionType.ANY, entry.permission_type)
        )

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(binding.pattern) and self.matches_entry(binding.entry)

    def exact_patterns(self) -> tuple[ResourcePattern, ...]:
        """The patterns a filter naming one type, one name and LITERAL, PREFIXED or ANY can
        select: a deletion reads them from the store even before this broker has seen
        them (Kafka's `filterToResources`); () for any other filter."""
        if self.name is None or not _known(self.resource_type):
            return ()
        kinds: tuple[PatternType, ...]
        if self.pattern_type == PatternType.ANY:
            kinds = (PatternType.LITERAL, PatternType.PREFIXED)
        elif self.pattern_type in (PatternType.LITERAL, PatternType.PREFIXED):
            kinds = (self.pattern_type,)
        else:
            return ()
        return tuple(ResourcePattern(self.resource_type, self.name, k) for k in kinds)
