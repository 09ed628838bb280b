"""DescribeAcls, CreateAcls and DeleteAcls, as Kafka's AclApis answers them.

DescribeAcls needs DESCRIBE on the cluster, the others ALTER (CLUSTER_AUTHORIZATION_FAILED);
without an authorizer every request is answered SECURITY_DISABLED. A creation Kafka
would refuse (an UNKNOWN or ANY type, operation or permission, a pattern other than
LITERAL or PREFIXED, an empty name, a cluster not named `kafka-cluster`) is answered
INVALID_REQUEST, the others are still created.
"""

from __future__ import annotations

import logging
from typing import Any

from tierbroker.broker.handlers.authorize import Op, unauthorized_cluster
from tierbroker.broker.handlers.common import (
    NO_THROTTLE,
    BrokerContext,
    field,
    make,
    response_module,
)
from tierbroker.broker.metadata.acl_changes import Failure, create_acls, delete_acls
from tierbroker.broker.network.request_context import current_request
from tierbroker.broker.security.authorizer.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)
NO_AUTHORIZER = "No Authorizer is configured on the broker"


def _enum(cls: type[Any], value: int) -> Any:
    """Kafka's reading of an int8 code: one it does not know is UNKNOWN."""
    try:
        return cls(value)
    except ValueError:
        return cls(0)


def _filter(f: Any) -> AclBindingFilter:
    return AclBindingFilter(
        resource_type=_enum(ResourceType, f.resource_type_filter),
        name=f.resource_name_filter,
        pattern_type=_enum(PatternType, field(f, "pattern_type_filter", PatternType.LITERAL)),
        principal=f.principal_filter,
        host=f.host_filter,
        operation=_enum(AclOperation, f.operation),
        permission_type=_enum(AclPermissionType, f.permission_type),
    )


def _error(failure: Failure) -> ErrorCode:
    return ErrorCode.invalid_request if failure.invalid else ErrorCode.unknown_server_error


async def handle_describe_acls(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    error, message, resources = ErrorCode.none, None, ()
    selected = _filter(request.body)
    if (denied := unauthorized_cluster(ctx, Op.DESCRIBE)) is not None:
        error, message = denied, None
    elif ctx.authorizer is None:
        error, message = ErrorCode.security_disabled, NO_AUTHORIZER
    elif (reason := selected.invalid_reason()) is not None:
        error, message = ErrorCode.invalid_request, reason
    else:
        by_pattern: dict[ResourcePattern, list[AccessControlEntry]] = {}
        for binding in ctx.authorizer.acls.bindings(selected):
            by_pattern.setdefault(binding.pattern, []).append(binding.entry)
        resources = tuple(
            make(
                m.DescribeAclsResource,
                resource_type=p.resource_type,
                resource_name=p.name,
                pattern_type=p.pattern_type,
                acls=tuple(
                    make(
                        m.AclDescription,
                        principal=e.principal,
                        host=e.host,
                        operation=e.operation,
                        permission_type=e.permission_type,
                    )
                    for e in entries
                ),
            )
            for p, entries in by_pattern.items()
        )
    return make(
        m.DescribeAclsResponse,
        throttle_time=NO_THROTTLE,
        error_code=error,
        error_message=message,
        resources=resources,
    )


async def handle_create_acls(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    creations = request.body.creations
    store = ctx.acl_store
    refused = unauthorized_cluster(ctx, Op.ALTER)
    if refused is not None or store is None:
        message = None if refused else NO_AUTHORIZER
        refused = refused or ErrorCode.security_disabled
        results = [(refused, message)] * len(creations)
    else:
        bindings = [
            AclBinding(
                ResourcePattern(
                    _enum(ResourceType, c.resource_type),
                    c.resource_name,
                    _enum(PatternType, field(c, "resource_pattern_type", PatternType.LITERAL)),
                ),
                AccessControlEntry(
                    c.principal,
                    c.host,
                    _enum(AclOperation, c.operation),
                    _enum(AclPermissionType, c.permission_type),
                ),
            )
            for c in creations
        ]
        failures = await create_acls(store, bindings)
        results = [
            (ErrorCode.none, None) if f is None else (_error(f), f.message) for f in failures
        ]
        _log_changes("created", bindings, failures)
    return make(
        m.CreateAclsResponse,
        throttle_time=NO_THROTTLE,
        results=tuple(
            make(m.AclCreationResult, error_code=code, error_message=message)
            for code, message in results
        ),
    )


async def handle_delete_acls(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    filters = [_filter(f) for f in request.body.filters]
    store = ctx.acl_store
    refused = unauthorized_cluster(ctx, Op.ALTER)
    if refused is not None or store is None:
        message = None if refused else NO_AUTHORIZER
        refused = refused or ErrorCode.security_disabled
        results = [
            make(
                m.DeleteAclsFilterResult,
                error_code=refused,
                error_message=message,
                matching_acls=(),
            )
            for _ in filters
        ]
    else:
        invalid = [f.invalid_reason() for f in filters]
        valid = [f for f, reason in zip(filters, invalid, strict=True) if reason is None]
        deleted = iter(await delete_acls(store, valid))
        results = []
        for reason in invalid:
            if reason is not None:
                results.append(
                    make(
                        m.DeleteAclsFilterResult,
                        error_code=ErrorCode.invalid_request,
                        error_message=reason,
                        matching_acls=(),
                    )
                )
                continue
            matching = next(deleted)
            _log_changes("deleted", [d.binding for d in matching], [d.failure for d in matching])
            results.append(
                make(
                    m.DeleteAclsFilterResult,
                    error_code=ErrorCode.none,
                    error_message=None,
                    matching_acls=tuple(
                        make(
                            m.DeleteAclsMatchingAcl,
                            error_code=ErrorCode.none if d.failure is None else _error(d.failure),
                            error_message=None if d.failure is None else d.failure.message,
                            resource_type=d.binding.pattern.resource_type,
                            resource_name=d.binding.pattern.name,
                            pattern_type=d.binding.pattern.pattern_type,
                            principal=d.binding.entry.principal,
                            host=d.binding.entry.host,
                            operation=d.binding.entry.operation,
                            permission_type=d.binding.entry.permission_type,
                        )
                        for d in matching
                    ),
                )
            )
    return make(m.DeleteAclsResponse, throttle_time=NO_THROTTLE, filter_results=tuple(results))


def _log_changes(what: str, bindings: list[AclBinding], failures: list[Failure | None]) -> None:
    who = current_request().principal
    for binding, failure in zip(bindings, failures, strict=True):
        e = binding.entry
        if failure is None:
            log.info(
                "ACL %s by %s: %s %s %s from host %s on %s",
                what,
                who,
                e.principal,
                e.permission_type.name,
                e.operation.name,
                e.host,
                binding.pattern,
            )
        else:
            log.info(
                "ACL not %s for %s on %s: %s", what, e.principal, binding.pattern, failure.message
            )
