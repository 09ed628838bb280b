"""`tierbroker acl list|add|remove`: the cluster's ACLs, with the options of Kafka's
kafka-acls.sh that apply (`--allow-principal`, `--operation`, `--topic`, ...).

A resource is `--topic`, `--group`, `--transactional-id` (each repeatable) or
`--cluster`; `--resource-pattern-type` is `literal` (the default of add and remove),
`prefixed`, or for list and remove `any` and `match` (every ACL that applies to the name).
As kafka-acls does, add grants each principal each operation on each resource, from
`--allow-host`/`--deny-host` (default `*`); remove without a principal removes every
ACL of the resource.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from tierbroker.broker.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    Output,
    OutputOption,
    Timeout,
    command_group,
    fail,
    print_json,
    print_table,
)
from tierbroker.broker.security.authorizer.acl import (
    CLUSTER_NAME,
    WILDCARD,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)

if TYPE_CHECKING:
    from tierbroker.broker.cli.wire_admin import WireAdmin

app = command_group("ACLs: list, add, remove (as kafka-acls.sh).")

Names = list[str] | None
Topics = Annotated[Names, typer.Option("--topic", help="a topic (repeatable)")]
Groups = Annotated[Names, typer.Option("--group", help="a consumer group (repeatable)")]
TransactionalIds = Annotated[
    Names, typer.Option("--transactional-id", help="a transactional id (repeatable)")
]
Cluster = Annotated[bool, typer.Option("--cluster", help="the cluster itself")]
PatternOption = Annotated[
    str | None,
    typer.Option(
        "--resource-pattern-type",
        help="literal (default of add and remove), prefixed, any (default of list), match",
    ),
]
AllowPrincipals = Annotated[
    Names, typer.Option("--allow-principal", help="Type:name, e.g. User:alice (repeatable)")
]
DenyPrincipals = Annotated[Names, typer.Option("--deny-principal", help="Type:name (repeatable)")]
AllowHosts = Annotated[Names, typer.Option("--allow-host", help="an IP address, or * (default)")]
DenyHosts = Annotated[Names, typer.Option("--deny-host", help="an IP address, or * (default)")]
Operations = Annotated[
    Names, typer.Option("--operation", help="Read, Write, Describe, All, ... (repeatable)")
]
Principal = Annotated[str | None, typer.Option("--principal", help="only this principal's")]


E = TypeVar("E", PatternType, AclOperation)


def _parse(cls: type[E], text: str, option: str) -> E:
    try:
        return cls.parse(text)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=option) from None


def _resources(
    topics: Names, groups: Names, transactional_ids: Names, cluster: bool
) -> list[tuple[ResourceType, str]]:
    found = [(ResourceType.TOPIC, n) for n in topics or ()]
    found += [(ResourceType.GROUP, n) for n in groups or ()]
    found += [(ResourceType.TRANSACTIONAL_ID, n) for n in transactional_ids or ()]
    if cluster:
        found.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return found


def _entries(
    allow: Names, deny: Names, allow_hosts: Names, deny_hosts: Names, operations: Names
) -> list[AccessControlEntry]:
    ops = [_parse(AclOperation, op, "--operation") for op in operations or ()]
    entries = []
    for principals, hosts, permission in (
        (allow, allow_hosts, AclPermissionType.ALLOW),
        (deny, deny_hosts, AclPermissionType.DENY),
    ):
        for principal in principals or ():
            if ":" not in principal:
                raise typer.BadParameter(f"{principal!r} is not Type:name, e.g. User:alice")
            for host in hosts or (WILDCARD,):
                entries += [AccessControlEntry(principal, host, op, permission) for op in ops]
    return entries


def _show(bindings: list[AclBinding], output: Output, title: str) -> None:
    rows = [
        {
            "resource_type": b.pattern.resource_type.name,
            "name": b.pattern.name,
            "pattern_type": b.pattern.pattern_type.name,
            "principal": b.entry.principal,
            "host": b.entry.host,
            "operation": b.entry.operation.name,
            "permission_type": b.entry.permission_type.name,
        }
        for b in bindings
    ]
    if output is Output.json:
        print_json(rows)
        return
    print_table(
        ("type", "name", "pattern", "principal", "host", "operation", "permission"),
        [tuple(r.values()) for r in rows],
        title=title,
        empty="no ACLs",
    )


@app.command("list")
def list_acls(
    topic: Topics = None,
    group: Groups = None,
    transactional_id: TransactionalIds = None,
    cluster: Cluster = False,
    resource_pattern_type: PatternOption = None,
    principal: Principal = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """The ACLs of the resources named, or every ACL."""
    pattern = _parse(PatternType, resource_pattern_type or "any", "--resource-pattern-type")
    resources: list[tuple[ResourceType, str | None]] = [
        *_resources(topic, group, transactional_id, cluster)
    ] or [(ResourceType.ANY, None)]
    filters = [
        AclBindingFilter(
            resource_type=t,
            name=name,
            pattern_type=pattern,
            principal=principal,
            host=None,
            operation=AclOperation.ANY,
            permission_type=AclPermissionType.ANY,
        )
        for t, name in resources
    ]
    from tierbroker.broker.cli.wire_admin import describe_acl_bindings, run_admin

    async def describe(admin: WireAdmin) -> list[AclBinding]:
        found: list[AclBinding] = []
        for f in filters:
            found += await describe_acl_bindings(admin, f)
        return found

    _show(run_admin("list ACLs", bootstrap, timeout, describe), output, "ACLs")


@app.command()
def add(
    allow_principal: AllowPrincipals = None,
    deny_principal: DenyPrincipals = None,
    allow_host: AllowHosts = None,
    deny_host: DenyHosts = None,
    operation: Operations = None,
    topic: Topics = None,
    group: Groups = None,
    transactional_id: TransactionalIds = None,
    cluster: Cluster = False,
    resource_pattern_type: PatternOption = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Grant (--allow-principal) or deny (--deny-principal) operations on resources."""
    pattern = _parse(PatternType, resource_pattern_type or "literal", "--resource-pattern-type")
    resources = _resources(topic, group, transactional_id, cluster)
    entries = _entries(allow_principal, deny_principal, allow_host, deny_host, operation)
    if not resources or not entries:
        raise typer.BadParameter(
            "name a resource (--topic, --group, --transactional-id, --cluster), a principal "
            "(--allow-principal, --deny-principal) and an --operation"
        )
    bindings = [
        AclBinding(ResourcePattern(t, name, pattern), e) for t, name in resources for e in entries
    ]
    from tierbroker.broker.cli.wire_admin import create_acl_bindings, run_admin

    errors = run_admin("add ACLs", bootstrap, timeout, lambda a: create_acl_bindings(a, bindings))
    failed = [(b, e) for b, e in zip(bindings, errors, strict=True) if e is not None]
    for binding, error in failed:
        typer.echo(
            f"error: add {binding.entry.principal} {binding.entry.operation.name} "
            f"on {binding.pattern}: {error}",
            err=True,
        )
    if failed:
        raise typer.Exit(1)
    typer.echo(f"added {len(bindings)} ACL" + ("" if len(bindings) == 1 else "s"), err=True)


@app.command()
def remove(
    allow_principal: AllowPrincipals = None,
    deny_principal: DenyPrincipals = None,
    allow_host: AllowHosts = None,
    deny_host: DenyHosts = None,
    operation: Operations = None,
    topic: Topics = None,
    group: Groups = None,
    transactional_id: TransactionalIds = None,
    cluster: Cluster = False,
    resource_pattern_type: PatternOption = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: OutputOption = Output.table,
) -> None:
    """Remove the ACLs given, or without a principal every ACL of the resources."""
    pattern = _parse(PatternType, resource_pattern_type or "literal", "--resource-pattern-type")
    resources = _resources(topic, group, transactional_id, cluster)
    if not resources:
        raise typer.BadParameter(
            "name a resource (--topic, --group, --transactional-id, --cluster)"
        )
    entries: list[tuple[str | None, str | None, AclOperation, AclPermissionType]]
    if allow_principal or deny_principal:
        if not operation:
            operation = ["Any"]
        entries = [
            (e.principal, e.host, e.operation, e.permission_type)
            for e in _entries(allow_principal, deny_principal, allow_host, deny_host, operation)
        ]
    else:
        entries = [(None, None, AclOperation.ANY, AclPermissionType.ANY)]
    filters = [
        AclBindingFilter(
            resource_type=t,
            name=name,
            pattern_type=pattern,
            principal=principal,
            host=host,
            operation=op,
            permission_type=permission,
        )
        for t, name in resources
        for principal, host, op, permission in entries
    ]
    from tierbroker.broker.cli.wire_admin import delete_acl_bindings, run_admin

    removed = run_admin(
        "remove ACLs", bootstrap, timeout, lambda a: delete_acl_bindings(a, filters)
    )
    if not removed:
        fail("remove ACLs: none matched")
    _show(removed, output, "removed")
