"""DescribeClientQuotas and AlterClientQuotas: the quotas of users and client ids.

As Kafka answers them: a describe filter's components each name an entity type once,
matching an exact name (0), the default entity (1) or any name (2); `strict` leaves out
entities of other types too; a malformed filter is INVALID_REQUEST for the whole
request, an unknown entity type UNSUPPORTED_VERSION (Kafka's `ClientQuotasImage`). An
alteration is checked per entity (Kafka's `ClientQuotaControlManager`): user and
client-id entities only, no type twice, no empty name, quota keys this broker enforces,
values above 0, integral for the byte rates, each key once; a failed entity is answered
with its error and the others are applied. `validate_only` checks and writes nothing.
Every broker may answer: they write the same znodes (`ClientQuotaStore`).

As in Kafka, describing needs DESCRIBE_CONFIGS on the cluster and altering ALTER_CONFIGS
(CLUSTER_AUTHORIZATION_FAILED: the whole describe, every entry of an alteration).
"""

from __future__ import annotations

import logging
from typing import Any

from tierbroker.broker.handlers.authorize import Op, unauthorized_cluster
from tierbroker.broker.handlers.common import NO_THROTTLE, BrokerContext, make, response_module
from tierbroker.broker.quota.entity import (
    CLIENT_ID,
    DEFAULT,
    QUOTA_KEYS,
    USER,
    Name,
    QuotaEntity,
)
from tierbroker.protocol.codec import Request
from tierbroker.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
_NOT_ENFORCED = {"controller_mutation_rate", "connection_creation_rate"}


async def handle_describe_client_quotas(
    ctx: BrokerContext, request: Request, _splicer: object
) -> Any:
    m = response_module(request.api_key, request.api_version)
    try:
        refused = unauthorized_cluster(ctx, Op.DESCRIBE_CONFIGS)
        if refused is not None:
            raise KafkaError(refused, "DESCRIBE_CONFIGS on the cluster is not allowed")
        exact, specified = _filter(request.body.components)
    except KafkaError as e:
        log.info("DescribeClientQuotas refused: %s", e.args[0])
        return make(
            m.DescribeClientQuotasResponse,
            throttle_time=NO_THROTTLE,
            error_code=e.code,
            error_message=str(e.args[0]),
            entries=None,
        )
    entries = []
    for entity, quotas in sorted(ctx.quotas.store.quotas.quotas.items(), key=lambda i: str(i[0])):
        parts = dict(entity.parts())
        if request.body.strict and len(parts) != len(exact) + len(specified):
            continue
        if any(kind not in parts or parts[kind] != name for kind, name in exact.items()):
            continue
        if any(kind not in parts for kind in specified):
            continue
        entries.append(
            m.EntryData(
                entity=tuple(
                    m.EntityData(entity_type=kind, entity_name=name) for kind, name in parts.items()
                ),
                values=tuple(m.ValueData(key=k, value=v) for k, v in sorted(quotas.items())),
            )
        )
    return make(
        m.DescribeClientQuotasResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        entries=tuple(entries),
    )


def _filter(components: Any) -> tuple[dict[str, str | None], set[str]]:
    """The filter's exact matches (None: the default entity) and its types matched by any
    name; KafkaError for a malformed one."""
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for c in components:
        if not c.entity_type:
            raise KafkaError(ErrorCode.invalid_request, "Invalid empty entity type.")
        if c.entity_type in exact or c.entity_type in specified:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"Entity type {c.entity_type} cannot appear more than once in the filter.",
            )
        if c.entity_type not in (USER, CLIENT_ID):
            raise KafkaError(
                ErrorCode.unsupported_version, f"Unsupported entity type {c.entity_type}"
            )
        if c.match_type == MATCH_EXACT:
            if c.match is None:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.",
                )
            exact[c.entity_type] = c.match
        elif c.match_type in (MATCH_DEFAULT, MATCH_SPECIFIED):
            if c.match is not None:
                kind = "DEFAULT" if c.match_type == MATCH_DEFAULT else "SPECIFIED"
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"Request specified MATCH_TYPE_{kind}, but also specified a match string.",
                )
            if c.match_type == MATCH_DEFAULT:
                exact[c.entity_type] = None
            else:
                specified.add(c.entity_type)
        else:
            raise KafkaError(ErrorCode.invalid_request, f"Unknown match type {c.match_type}")
    return exact, specified


async def handle_alter_client_quotas(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
    m = response_module(request.api_key, request.api_version)
    results = []
    seen: set[QuotaEntity] = set()
    refused = unauthorized_cluster(ctx, Op.ALTER_CONFIGS)
    for entry in request.body.entries:
        error, message = ErrorCode.none, None
        try:
            if refused is not None:
                raise KafkaError(refused, "ALTER_CONFIGS on the cluster is not allowed")
            entity = _entity(entry.entity)
            if entity in seen:
                raise KafkaError(ErrorCode.invalid_request, f"Ignoring duplicate entity {entity}")
            seen.add(entity)
            changes = _changes(entry.ops)
            if not request.body.validate_only:
                await ctx.quotas.store.alter(entity, changes)
                log.info("client quotas of %s altered: %s", entity, changes)
        except KafkaError as e:
            error, message = e.code, str(e.args[0])
            log.info("AlterClientQuotas of %s refused: %s", _shown(entry.entity), message)
        results.append(
            make(
                m.EntryData,
                error_code=error,
                error_message=message,
                entity=tuple(
                    m.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
                    for e in entry.entity
                ),
            )
        )
    return make(m.AlterClientQuotasResponse, throttle_time=NO_THROTTLE, entries=tuple(results))


def _entity(parts: Any) -> QuotaEntity:
    names: dict[str, Name] = {}
    if not parts:
        raise KafkaError(ErrorCode.invalid_request, "Invalid empty client quota entity")
    for part in parts:
        if part.entity_type in names:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"Invalid client quota entity, duplicate entity entry {part.entity_type}",
            )
        if part.entity_type not in (USER, CLIENT_ID):
            raise KafkaError(
                ErrorCode.invalid_request,
                f"Unhandled client quota entity type: {part.entity_type}"
                + (" (ip quotas are not supported)" if part.entity_type == "ip" else ""),
            )
        if part.entity_name == "":
            raise KafkaError(ErrorCode.invalid_request, f"Empty {part.entity_type} not supported")
        names[part.entity_type] = DEFAULT if part.entity_name is None else part.entity_name
    return QuotaEntity(names.get(USER), names.get(CLIENT_ID))


def _changes(ops: Any) -> dict[str, float | None]:
    changes: dict[str, float | None] = {}
    for op in ops:
        if op.key in changes:
            raise KafkaError(ErrorCode.invalid_request, f"Duplicate quota key {op.key}")
        if op.key not in QUOTA_KEYS:
            reason = " (not enforced by this broker)" if op.key in _NOT_ENFORCED else ""
            message = f"Invalid configuration key {op.key}{reason}"
            raise KafkaError(ErrorCode.invalid_request, message)
        if op.remove:
            changes[op.key] = None
            continue
        value = float(op.value)
        if value <= 0.0:
            raise KafkaError(ErrorCode.invalid_request, f"Quota {op.key} must be greater than 0")
        if QUOTA_KEYS[op.key]:
            if value > 2**63 - 1:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"Proposed value for {op.key} is too large for a LONG.",
                )
            if abs(value % 1.0) > 1e-6:
                raise KafkaError(
                    ErrorCode.invalid_request, f"{op.key} cannot be a fractional value."
                )
        changes[op.key] = value
    return changes


def _shown(parts: Any) -> str:
    return ", ".join(f"{p.entity_type}={p.entity_name or '<default>'}" for p in parts)
