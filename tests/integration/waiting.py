"""Waiting in tests for what a broker or cluster does in its own time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None],
    what: str,
    timeout_s: float = 120,
    interval_s: float = 0.1,
    show: Callable[[], object] | None = None,
) -> T:
    """Poll `condition` until it returns something truthy (returned); fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            seen = show() if show is not None else value
            raise AssertionError(
                f"timed out after {timeout_s}s waiting for {what}; last seen: {seen}"
            )
        time.sleep(interval_s)
