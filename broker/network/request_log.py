"""The request log: one DEBUG line per completed request, as Kafka's `kafka.request.logger`.

Its logger, `tierbroker.request`, is off unless named (`serve --log-level
tierbroker.request=DEBUG`), as Kafka's is, so `--log-level DEBUG` alone does not log
every request. A line names the API and its version, the correlation id, the client
id, the peer, and the time from the request's frame to its encoded response in ms
(waits in purgatory included; sending the response is not). The dispatcher asks
`request_log.isEnabledFor(DEBUG)` once per request and formats nothing otherwise.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tierbroker.protocol.codec import Request

REQUEST_LOGGER = "tierbroker.request"
request_log = logging.getLogger(REQUEST_LOGGER)


def log_completed(request: Request, peer: str, started_s: float) -> None:
    """Log `request`, handled since `started_s` (`time.perf_counter()`)."""
    request_log.debug(
        "Completed request: %s v%d correlation_id=%d client_id=%r from %s in %.3f ms",
        type(request.body).__name__.removesuffix("Request"),
        request.api_version,
        request.correlation_id,
        request.client_id,
        peer,
        (time.perf_counter() - started_s) * 1000,
    )
