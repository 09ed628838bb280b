"""ApiVersions: the API keys and version ranges this broker answers, and (v3+) its
features.

Ranges are the pinned `protocol.versions`, except Produce, advertised from v0 as
Kafka 4 does: older librdkafka releases stop compressing when v0-2 are missing;
those versions are still refused (the connection is closed).

The one feature is `transaction.version` (levels 0-2), finalized at the broker's
`transaction.version`: at 2 Kafka's Java client uses transactions v2 (KIP-890 part 2).
The finalized features' epoch is the time the handler was made, so a broker restarted
with another level is believed over what clients learnt before.
"""

from __future__ import annotations

import time
from typing import Any

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.static.primitive import i16, i64

from tierbroker.broker.handlers.common import NO_THROTTLE, BrokerContext, make, response_module
from tierbroker.protocol.codec import Request, version_range
from tierbroker.protocol.errors import ErrorCode

API_VERSIONS = 18
PRODUCE = 0
ADVERTISED_MIN_VERSION = {PRODUCE: 0}
TRANSACTION_VERSION = "transaction.version"
TRANSACTION_VERSION_LEVELS = (0, 2)


def advertised(api_keys: list[int]) -> list[tuple[int, int, int]]:
    ranges = []
    for key in sorted(api_keys):
        low, high = version_range(key) or (0, -1)
        ranges.append((key, ADVERTISED_MIN_VERSION.get(key, low), high))
    return ranges


def unsupported_version_response() -> ApiVersionsResponseV0:
    """The v0 answer to an ApiVersions request of a version this broker does not know."""
    low, high = version_range(API_VERSIONS) or (0, 0)
    return ApiVersionsResponseV0(
        error_code=ErrorCode.unsupported_version,
        api_keys=(
            ApiVersionV0(api_key=i16(API_VERSIONS), min_version=i16(low), max_version=i16(high)),
        ),
    )


def make_handler(api_keys: list[int]) -> Any:
    ranges = advertised(api_keys)
    features_epoch = time.time_ns() // 1_000_000

    async def handle(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
        m = response_module(request.api_key, request.api_version)
        api_keys = tuple(
            make(m.ApiVersion, api_key=k, min_version=lo, max_version=hi) for k, lo, hi in ranges
        )
        if request.api_version < 3:  # features came in v3
            return make(
                m.ApiVersionsResponse,
                error_code=ErrorCode.none,
                api_keys=api_keys,
                throttle_time=NO_THROTTLE,
            )
        level = ctx.config.transaction_version
        low, high = TRANSACTION_VERSION_LEVELS
        supported = m.SupportedFeatureKey(
            name=TRANSACTION_VERSION, min_version=i16(low), max_version=i16(high)
        )
        # As Kafka, a feature at level 0 is not finalized.
        finalized = m.FinalizedFeatureKey(
            name=TRANSACTION_VERSION, max_version_level=i16(level), min_version_level=i16(level)
        )
        return m.ApiVersionsResponse(
            error_code=ErrorCode.none,
            api_keys=api_keys,
            throttle_time=NO_THROTTLE,
            supported_features=(supported,),
            finalized_features_epoch=i64(features_epoch),
            finalized_features=(finalized,) if level > 0 else (),
        )

    return handle
