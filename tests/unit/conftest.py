"""A broker in a test's process may leave the collector disabled, and the tests that let it
freeze the heap (`storage.long_lived`) leave it frozen: each test ends with the collector
as the next one expects it, enabled and nothing frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def collector() -> Iterator[None]:
    yield
    gc.enable()
    gc.unfreeze()
