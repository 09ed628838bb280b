"""`SocketServerMetrics`: Kafka's `socket-server-metrics` per listener, and the log line of a
failed authentication.

Kafka's JMX attributes become Prometheus series labelled by listener: `connection_count`,
`connection_creation_total`, `connection_close_total`, `successful_authentication_total`,
`failed_authentication_total`, `successful_reauthentication_total` and
`failed_reauthentication_total`. As in Kafka, a connection in the clear or over TLS
without SASL counts as authenticated once it is set up, and a failed TLS handshake as a
failed authentication.

A failed authentication is logged with the client's address, the listener and, when
known, the user it claimed; past `FAILED_AUTHENTICATION_LOGS_PER_MINUTE` a minute the
lines stop and the next one says how many were left out, so a burst of bad clients
cannot flood the log.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

FAILED_AUTHENTICATION_LOGS_PER_MINUTE = 20


class SocketServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry or CollectorRegistry()
        labels = ["listener"]
        self.connection_count = Gauge(
            "connection_count", "Open connections", labels, registry=registry
        )
        self.connection_creation = Counter(
            "connection_creation", "Connections accepted", labels, registry=registry
        )
        self.connection_close = Counter(
            "connection_close", "Connections closed", labels, registry=registry
        )
        self.successful_authentication = Counter(
            "successful_authentication",
            "Connections authenticated",
            labels,
            registry=registry,
        )
        self.failed_authentication = Counter(
            "failed_authentication",
            "Connections that failed to authenticate (TLS handshake or SASL)",
            labels,
            registry=registry,
        )
        self.successful_reauthentication = Counter(
            "successful_reauthentication",
            "SASL re-authentications that succeeded (KIP-368)",
            labels,
            registry=registry,
        )
        self.failed_reauthentication = Counter(
            "failed_reauthentication",
            "SASL re-authentications that failed (KIP-368)",
            labels,
            registry=registry,
        )
        self._window_start = float("-inf")
        self._logged = 0
        self._left_out = 0

    def authenticated(self, listener: str, reauthentication: bool = False) -> None:
        counter = (
            self.successful_reauthentication if reauthentication else self.successful_authentication
        )
        counter.labels(listener).inc()

    def authentication_failed(
        self,
        listener: str,
        address: str,
        reason: str,
        user: str | None = None,
        reauthentication: bool = False,
    ) -> None:
        """Count a failed authentication and log it, within the log's rate."""
        counter = self.failed_reauthentication if reauthentication else self.failed_authentication
        counter.labels(listener).inc()
        now = time.monotonic()
        if now - self._window_start >= 60:
            if self._left_out:
                log.warning(
                    "%d more failed authentications were not logged in the last minute",
                    self._left_out,
                )
            self._window_start, self._logged, self._left_out = now, 0, 0
        if self._logged >= FAILED_AUTHENTICATION_LOGS_PER_MINUTE:
            self._left_out += 1
            return
        self._logged += 1
        who = f" as {user!r}" if user else ""
        what = "re-authentication" if reauthentication else "authentication"
        log.warning("failed %s from %s%s on listener %s: %s", what, address, who, listener, reason)
