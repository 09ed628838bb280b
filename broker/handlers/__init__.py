"""Request handlers, one module per API family, and the dispatcher that routes to them.

A handler translates a kio request entity into calls on the ReplicaManager or the
Controller, and their results into a kio response entity; it holds no state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from tierbroker.broker.handlers import (
    acls,
    admin,
    api_versions,
    client_quotas,
    configs,
    elections,
    fetch,
    group_offsets,
    groups,
    log_dirs,
    metadata,
    offsets,
    produce,
    producers,
    reassignments,
    sasl,
    scram_credentials,
    transactions,
)
from tierbroker.broker.handlers.common import BrokerContext
from tierbroker.broker.network.request_context import RequestContext, set_current_request
from tierbroker.broker.network.request_log import log_completed, request_log
from tierbroker.broker.network.socket_server import ConnectionClosing, KafkaConnection
from tierbroker.broker.quota.request_time import LoopTime
from tierbroker.protocol.codec import (
    RecordsSplicer,
    Request,
    ResponsePart,
    UnsupportedVersionError,
    encode_response,
    parse_request,
)
from tierbroker.protocol.errors import KafkaError

log = logging.getLogger(__name__)

Handler = Callable[[BrokerContext, Request, RecordsSplicer], Coroutine[Any, Any, Any]]

_HANDLERS: dict[int, Handler] = {
    0: produce.handle_produce,
    1: fetch.handle_fetch,
    2: offsets.handle_list_offsets,
    3: metadata.handle_metadata,
    8: group_offsets.handle_offset_commit,
    9: group_offsets.handle_offset_fetch,
    10: groups.handle_find_coordinator,
    11: groups.handle_join_group,
    12: groups.handle_heartbeat,
    13: groups.handle_leave_group,
    14: groups.handle_sync_group,
    15: groups.handle_describe_groups,
    16: groups.handle_list_groups,
    19: admin.handle_create_topics,
    20: admin.handle_delete_topics,
    21: log_dirs.handle_delete_records,
    22: producers.handle_init_producer_id,
    23: offsets.handle_offset_for_leader_epoch,
    24: transactions.handle_add_partitions_to_txn,
    25: transactions.handle_add_offsets_to_txn,
    26: transactions.handle_end_txn,
    27: transactions.handle_write_txn_markers,
    28: transactions.handle_txn_offset_commit,
    29: acls.handle_describe_acls,
    30: acls.handle_create_acls,
    31: acls.handle_delete_acls,
    32: configs.handle_describe_configs,
    33: configs.handle_alter_configs,
    35: log_dirs.handle_describe_log_dirs,
    37: admin.handle_create_partitions,
    42: groups.handle_delete_groups,
    43: elections.handle_elect_leaders,
    44: configs.handle_incremental_alter_configs,
    45: reassignments.handle_alter_partition_reassignments,
    46: reassignments.handle_list_partition_reassignments,
    47: group_offsets.handle_offset_delete,
    48: client_quotas.handle_describe_client_quotas,
    49: client_quotas.handle_alter_client_quotas,
    50: scram_credentials.handle_describe_user_scram_credentials,
    51: scram_credentials.handle_alter_user_scram_credentials,
    60: metadata.handle_describe_cluster,
    61: producers.handle_describe_producers,
    65: transactions.handle_describe_transactions,
    66: transactions.handle_list_transactions,
    75: metadata.handle_describe_topic_partitions,
}
HANDLERS: dict[int, Handler] = {
    **_HANDLERS,
    api_versions.API_VERSIONS: api_versions.make_handler(
        [*_HANDLERS, api_versions.API_VERSIONS, *sasl.API_KEYS]
    ),
}


# A response listing this many partitions is encoded in a worker thread: encoding a
# Fetch or Metadata answer over 1,000 partitions takes 6 to 10 ms of CPU, which the loop
# would otherwise spend in one callback. The worker yields the interpreter to the loop at
# every switch interval.
ENCODE_IN_WORKER_PARTITIONS = 256


def _partitions_listed(body: Any) -> int:
    """How many partitions a response lists under its topics (Fetch, Metadata, ...)."""
    topics = getattr(body, "responses", None) or getattr(body, "topics", None)
    if not isinstance(topics, tuple):
        return 0
    return sum(len(getattr(t, "partitions", ())) for t in topics)


class RequestDispatcher:
    """Decodes a request frame, runs its handler, encodes the response."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def handle(
        self, frame: bytes | memoryview, connection: KafkaConnection
    ) -> list[ResponsePart] | None:
        peer = connection.peer
        logged = request_log.isEnabledFor(logging.DEBUG)
        started_s = time.perf_counter() if logged else 0.0
        if sasl.expects_raw_token(connection):
            return await sasl.raw_token(connection, frame)
        try:
            request = parse_request(frame)
        except UnsupportedVersionError as e:
            if e.api_key == api_versions.API_VERSIONS:
                log.info(
                    "ApiVersions v%d from %s is not supported; answering v0", e.api_version, peer
                )
                return encode_response(
                    e.correlation_id, api_versions.unsupported_version_response()
                )
            raise ConnectionClosing(str(e)) from None
        except KafkaError as e:
            raise ConnectionClosing(str(e)) from None
        sasl.admit(connection, request.api_key)
        if request.api_key in sasl.API_KEYS:
            return await sasl.handle(connection, request)
        handler = HANDLERS.get(request.api_key)
        if handler is None:
            raise ConnectionClosing(f"api_key {request.api_key} is not supported")
        splicer = RecordsSplicer()
        context = RequestContext(
            connection.principal,
            connection.ip,
            connection.listener.name,
            connection.listener.security_protocol,
            request.client_id or "",
        )
        set_current_request(context)
        quotas = self.ctx.quotas
        handling = handler(self.ctx, request, splicer)
        timed: LoopTime[Any] | None = (
            LoopTime(handling) if quotas.time_of(request, context) else None
        )
        body = await (handling if timed is None else timed)
        body, throttle_ms = quotas.settle(request, context, len(frame), timed, body)
        if throttle_ms:
            connection.mute_after_response(throttle_ms)
        response = None
        if body is not None and _partitions_listed(body) >= ENCODE_IN_WORKER_PARTITIONS:
            response = await asyncio.get_running_loop().run_in_executor(
                None, encode_response, request.correlation_id, body, splicer
            )
        elif body is not None:
            response = encode_response(request.correlation_id, body, splicer)
        if logged:
            log_completed(request, peer, started_s)
        return response
