"""`Authorizer`: whether a principal, from a host, may do an operation on a resource.

Kafka's decision (StandardAuthorizerData, AclAuthorizer): a super user (`super.users`)
may do anything; otherwise the ACLs whose pattern applies to the resource are read (its
literal name, the literal `*`, prefixed patterns of the name) and those for the principal
(or `User:*`) and the host (or `*`) are weighed: any DENY of the operation (or ALL)
refuses, else any ALLOW grants. An ALLOW of READ, WRITE, DELETE or ALTER also allows
DESCRIBE, and one of ALTER_CONFIGS allows DESCRIBE_CONFIGS; a DENY denies only the
operation it names. Without any ACL on the resource, `allow.everyone.if.no.acl.found`
decides (default false); with ACLs none of which grants, the answer is no.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from tierbroker.broker.security.authorizer.acl import (
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tierbroker.broker.security.authorizer.acl_cache import AclCache
from tierbroker.broker.security.principal import KafkaPrincipal

log = logging.getLogger("tierbroker.authorizer")  # Kafka's kafka.authorizer.logger

AUTHORIZER_CLASS_NAMES = frozenset(
    {
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "kafka.security.authorizer.AclAuthorizer",
    }
)
_ALLOWS = AclPermissionType.ALLOW
_DENIES = AclPermissionType.DENY
# The operations whose ALLOW also allows the key (an ACL of ALL allows everything).
_IMPLIED_BY: Mapping[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset(
        {
            AclOperation.DESCRIBE,
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.DELETE,
            AclOperation.ALTER,
        }
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset(
        {AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    ),
}


@dataclass(frozen=True, slots=True)
class AuthorizerConfig:
    super_users: frozenset[str]  # principals as `Type:name`
    allow_everyone_if_no_acl_found: bool = False

    @classmethod
    def from_properties(cls, get: Mapping[str, str]) -> AuthorizerConfig | None:
        """The authorizer `authorizer.class.name` asks for, None when it is unset or empty;
        ValueError naming the property for a class other than Kafka's two, a principal
        of `super.users` that is not `Type:name`, or a boolean that is not one."""
        class_name = (get.get("authorizer.class.name") or "").strip()
        if not class_name:
            return None
        if class_name not in AUTHORIZER_CLASS_NAMES:
            raise ValueError(
                f"authorizer.class.name={class_name}: tierbroker implements Kafka's "
                + " and ".join(sorted(AUTHORIZER_CLASS_NAMES))
            )
        super_users = set()
        for text in (get.get("super.users") or "").split(";"):
            if text.strip():
                try:
                    super_users.add(str(KafkaPrincipal.parse(text)))
                except ValueError as e:
                    raise ValueError(f"super.users: {e}") from None
        allow = (get.get("allow.everyone.if.no.acl.found") or "false").strip().lower()
        if allow not in ("true", "false"):
            raise ValueError(f"allow.everyone.if.no.acl.found={allow}: expected true or false")
        return cls(frozenset(super_users), allow == "true")


class Authorizer:
    """Decides with the ACLs of `acls`, which the ACL store keeps current."""

    def __init__(self, config: AuthorizerConfig, acls: AclCache | None = None) -> None:
        self.config = config
        self.acls = acls if acls is not None else AclCache()

    def is_super_user(self, principal: KafkaPrincipal) -> bool:
        return str(principal) in self.config.super_users

    def authorize(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        log_if_denied: bool = True,
    ) -> bool:
        """Whether `principal` from `host` may do `operation` on the named resource.
        A refusal the client asked for is logged at INFO (Kafka's audit line); one that
        only filters (Metadata's list of every topic) at DEBUG."""
        if str(principal) in self.config.super_users:
            return True
        who = str(principal)
        granting = _IMPLIED_BY.get(operation)
        found_any = allowed = False
        for entry in self.acls.matching(resource_type, name):
            found_any = True
            if entry.principal != who and entry.principal != WILDCARD_PRINCIPAL:
                continue
            if entry.host != host and entry.host != WILDCARD:
                continue
            op = entry.operation
            if entry.permission_type == _DENIES:
                if op == operation or op == AclOperation.ALL:
                    allowed = False
                    break
            elif not allowed and (
                op == operation
                or op == AclOperation.ALL
                or (granting is not None and op in granting)
            ):
                allowed = True
        else:
            if not found_any:
                allowed = self.config.allow_everyone_if_no_acl_found
        if not allowed:
            log.log(
                logging.INFO if log_if_denied else logging.DEBUG,
                "Principal = %s is Denied Operation = %s from host = %s on resource = %s:%s",
                principal,
                operation.pascal_name,
                host,
                resource_type.pascal_name,
                name,
            )
        return allowed

    def authorize_by_resource_type(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        """Whether `principal` may do `operation` on some resource of the type: an ALLOW
        (of the operation or ALL, for the principal or `User:*`, the host or `*`) on a
        literal name or prefix that no DENY covers (Kafka's `authorizeByResourceType`,
        which InitProducerId asks of WRITE on topics)."""
        if self.is_super_user(principal):
            return True
        allow_literal: set[str] = set()
        allow_prefix: set[str] = set()
        deny_literal: set[str] = set()
        deny_prefix: set[str] = set()
        who = str(principal)
        for pattern, entries in self.acls.patterns_of_type(resource_type):
            for e in entries:
                if (
                    e.principal in (who, WILDCARD_PRINCIPAL)
                    and e.host in (host, WILDCARD)
                    and e.operation in (operation, AclOperation.ALL)
                ):
                    prefixed = pattern.pattern_type == PatternType.PREFIXED
                    if e.permission_type == _DENIES:
                        (deny_prefix if prefixed else deny_literal).add(pattern.name)
                    elif e.permission_type == _ALLOWS:
                        (allow_prefix if prefixed else allow_literal).add(pattern.name)
        if WILDCARD in deny_literal:
            return False
        if self.config.allow_everyone_if_no_acl_found:
            return True

        def denied_by_prefix(name: str) -> bool:
            return any(name[:n] in deny_prefix for n in range(1, len(name) + 1))

        return any(not denied_by_prefix(p) for p in allow_prefix) or any(
            n == WILDCARD or (n not in deny_literal and not denied_by_prefix(n))
            for n in allow_literal
        )
