"""`RemoteStorageHealth`: whether the remote store works, as the latest call to it found.

Checked once when the RemoteLogManager starts (`RemoteStorageManager.check`, bounded
by `CHECK_TIMEOUT_S`, so a store that does not answer holds the start that long at
most), then kept true by the calls that follow: a copy or a remote read the store
served makes it healthy; one that failed on the store's side (a plugin error, a
timeout, an I/O error) makes it unhealthy, with that error. A missing object is an
answer, not a failure, and errors that are not the store's (an offset out of range, a
bug) change nothing. Until either happens the state is "not checked" (a plugin with no
check, before its first copy or read).

Shown as the gauge `RemoteStorageHealthy` (1 healthy, 0 unhealthy, -1 not checked) and
by `tierbroker tier status`. A failed start check is logged as one WARNING line naming
what to fix, a recovery as one INFO line; later failures are reported by the caller
(the copy pool logs each failed copy). Used on the event loop only.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from tierbroker.storage.log import now_ms
from tierbroker.storage.remote.storage_manager import (
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
)

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 5.0
_CHECK_GRACE_S = 1.0  # past the plugin's own bound, before the check is given up


class HealthState(enum.Enum):
    NOT_CHECKED = "not checked"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


_GAUGE_VALUES = {HealthState.NOT_CHECKED: -1, HealthState.HEALTHY: 1, HealthState.UNHEALTHY: 0}


def describe(error: BaseException) -> str:
    """An error in one line: its message, or its type when it has none (a timeout)."""
    return str(error) or type(error).__name__


def is_store_failure(error: BaseException) -> bool:
    """Whether `error`, raised by a call to the plugin, says the store does not work."""
    if isinstance(error, RemoteResourceNotFoundError):
        return False
    return isinstance(error, RemoteStorageError | OSError | TimeoutError)


class RemoteStorageHealth:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.gauge = Gauge(
            "RemoteStorageHealthy",
            "Whether the remote store works: 1 yes, 0 no, -1 not checked yet",
            registry=registry,
        )
        self.state = HealthState.NOT_CHECKED
        self.error: str | None = None
        self.since_ms = now_ms()
        self.gauge.set(_GAUGE_VALUES[self.state])

    async def check(self, rsm: RemoteStorageManager, timeout_s: float = CHECK_TIMEOUT_S) -> None:
        """Try the store once; a failure is one WARNING line, and the broker goes on."""
        try:
            async with asyncio.timeout(timeout_s + _CHECK_GRACE_S):
                checked = await rsm.check(timeout_s)
        except Exception as e:
            reason = describe(e)
            if isinstance(e, TimeoutError):  # the plugin overran its own bound
                reason = f"{type(rsm).__name__}.check() did not finish in {timeout_s:g}s"
            self._set(HealthState.UNHEALTHY, reason)
            log.warning(
                "remote storage check failed: %s (the local tier serves on; copies retry)",
                reason,
            )
            return
        if checked:
            self._set(HealthState.HEALTHY, None)
            log.info("remote storage checked: it works")
        else:
            log.info("remote storage: %s has no check", type(rsm).__name__)

    def succeeded(self) -> None:
        """A call the store served."""
        if self.state is not HealthState.HEALTHY:
            if self.state is HealthState.UNHEALTHY:
                log.info("remote storage works again (it failed with: %s)", self.error)
            self._set(HealthState.HEALTHY, None)

    def failed(self, error: BaseException) -> None:
        """A call that raised `error`; it counts only if the store is to blame."""
        if is_store_failure(error):
            self._set(HealthState.UNHEALTHY, describe(error))

    def _set(self, state: HealthState, error: str | None) -> None:
        if state is not self.state:
            self.since_ms = now_ms()
            self.gauge.set(_GAUGE_VALUES[state])
        self.state, self.error = state, error

    def as_dict(self) -> dict[str, Any]:
        """What `/tier/health` answers: the state, the error if unhealthy, since when (ms)."""
        return {"state": self.state.value, "error": self.error, "since_ms": self.since_ms}
