"""ApiVersions: the API keys and version ranges this broker answers.

Ranges are the pinned `protocol.versions`, except Produce, advertised from v0 as
Kafka 4 does: older librdkafka releases stop compressing when v0-2 are missing;
those versions are still refused (the connection is closed).
"""

from __future__ import annotations

from typing import Any

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.static.primitive import i16

from tierbroker.broker.handlers.common import NO_THROTTLE, BrokerContext, make, response_module
from tierbroker.protocol.codec import Request, version_range
from tierbroker.protocol.errors import ErrorCode

API_VERSIONS = 18
PRODUCE = 0
ADVERTISED_MIN_VERSION = {PRODUCE: 0}


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

    async def handle(ctx: BrokerContext, request: Request, _splicer: object) -> Any:
        m = response_module(request.api_key, request.api_version)
        return make(
            m.ApiVersionsResponse,
            error_code=ErrorCode.none,
            api_keys=tuple(
                make(m.ApiVersion, api_key=k, min_version=lo, max_version=hi)
                for k, lo, hi in ranges
            ),
            throttle_time=NO_THROTTLE,
        )

    return handle
