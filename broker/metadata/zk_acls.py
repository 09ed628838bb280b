"""ACLs in ZooKeeper's layout, as Kafka's AclAuthorizer keeps them (ZkData's ZkAclStore).

| znode | content |
|---|---|
| `/kafka-acl/<Type>/<name>` | a LITERAL pattern's ACLs: |
| | `{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow",` |
| | `"operation":"Read","host":"*"}]}` |
| `/kafka-acl-extended/prefixed/<Type>/<name>` | a PREFIXED pattern's ACLs, the same JSON |
| `/kafka-acl-changes/acl_changes_<seq>` | a change of a LITERAL pattern: `TOPIC:<name>` |
| `/kafka-acl-extended-changes/acl_changes_<seq>` | of another: `{"version":1,` |
| | `"resourceType":"TOPIC","name":...,"patternType":"PREFIXED"}` |

`<Type>` is the Pascal-case name (`Topic`, `TransactionalId`). A pattern without ACLs
has no znode. The change notices are written for Kafka's tools and brokers, which follow
them; tierbroker's brokers watch the ACL znodes themselves.
"""

from __future__ import annotations

import json

from tierbroker.broker.security.authorizer.acl import (
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)

LITERAL_ROOT = "/kafka-acl"
PREFIXED_ROOT = "/kafka-acl-extended/prefixed"
LITERAL_CHANGES = "/kafka-acl-changes"
EXTENDED_CHANGES = "/kafka-acl-extended-changes"
CHANGE_PREFIX = "acl_changes_"
ROOTS = {PatternType.LITERAL: LITERAL_ROOT, PatternType.PREFIXED: PREFIXED_ROOT}


def type_path(pattern_type: PatternType, resource_type: ResourceType) -> str:
    return f"{ROOTS[pattern_type]}/{resource_type.pascal_name}"


def resource_path(pattern: ResourcePattern) -> str:
    return f"{type_path(pattern.pattern_type, pattern.resource_type)}/{pattern.name}"


def encode_acls(entries: frozenset[AccessControlEntry]) -> bytes:
    acls = [
        {
            "principal": e.principal,
            "permissionType": e.permission_type.pascal_name,
            "operation": e.operation.pascal_name,
            "host": e.host,
        }
        for e in sorted(
            entries, key=lambda e: (e.principal, e.host, e.operation, e.permission_type)
        )
    ]
    return json.dumps({"version": 1, "acls": acls}, separators=(",", ":")).encode()


def decode_acls(data: bytes) -> frozenset[AccessControlEntry]:
    """A resource znode's ACLs; ValueError (or KeyError, TypeError) if it does not decode."""
    if not data:
        return frozenset()
    document = json.loads(data)
    if document.get("version") != 1:
        raise ValueError(f"ACL znode version {document.get('version')!r}, expected 1")
    return frozenset(
        AccessControlEntry(
            principal=str(acl["principal"]),
            host=str(acl["host"]),
            operation=AclOperation.parse(acl["operation"]),
            permission_type=AclPermissionType.parse(acl["permissionType"]),
        )
        for acl in document["acls"]
    )


def change_notice(pattern: ResourcePattern) -> tuple[str, bytes]:
    """The sequential znode's path prefix and data announcing a change of `pattern`."""
    if pattern.pattern_type == PatternType.LITERAL:
        data = f"{pattern.resource_type.name}:{pattern.name}".encode()
        return f"{LITERAL_CHANGES}/{CHANGE_PREFIX}", data
    event = {
        "version": 1,
        "resourceType": pattern.resource_type.name,
        "name": pattern.name,
        "patternType": pattern.pattern_type.name,
    }
    return f"{EXTENDED_CHANGES}/{CHANGE_PREFIX}", json.dumps(event).encode()
