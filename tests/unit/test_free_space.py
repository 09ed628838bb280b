"""`FreeSpaceGuard`: produce to a log dir below `log.dir.min.free.bytes` is refused, with
one log line a minute, and accepted again once space is freed; statvfs is read at most
once a second per dir, and again at once when the bytes admitted could cross the floor."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tierbroker.storage import free_space
from tierbroker.storage.free_space import FreeSpaceGuard

BLOCK = 4096


class FakeFilesystem:
    """statvfs and the monotonic clock of the module, set by the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.free_bytes = total_bytes
        self.reads = 0
        self.now = 1000.0
        monkeypatch.setattr(free_space, "os", SimpleNamespace(statvfs=self._statvfs))
        monkeypatch.setattr(free_space, "time", SimpleNamespace(monotonic=lambda: self.now))

    def _statvfs(self, path: Path) -> os.statvfs_result:
        self.reads += 1
        fields = [BLOCK, BLOCK, self.total_bytes // BLOCK, 0, self.free_bytes // BLOCK]
        return os.statvfs_result((*fields, 0, 0, 0, 0, 255))


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refusing produce" in r.getMessage()]


def test_below_the_floor_produce_is_refused_until_space_returns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fs = FakeFilesystem(monkeypatch, total_bytes=1 << 30)
    guard = FreeSpaceGuard(100 * BLOCK)
    log_dir = Path("/logs")
    fs.free_bytes = 150 * BLOCK
    assert guard.refusal(log_dir, 10 * BLOCK) is None
    assert guard.refusal(log_dir, 10 * BLOCK) is None
    assert fs.reads == 1  # the admitted bytes are counted, not read again
    fs.free_bytes = 120 * BLOCK
    # 30 blocks counted as used leave 20 above the floor: this one could cross, so it reads.
    assert guard.refusal(log_dir, 30 * BLOCK) is None
    assert fs.reads == 2
    fs.free_bytes = 90 * BLOCK
    reason = guard.refusal(log_dir, BLOCK)
    assert reason is not None and "log.dir.min.free.bytes" in reason
    for _ in range(10):
        fs.now += 1.5
        assert guard.refusal(log_dir, BLOCK) is not None
    assert len(refusals(caplog)) == 1 and "/logs has 368640 bytes free" in refusals(caplog)[0]
    fs.now += 60
    assert guard.refusal(log_dir, BLOCK) is not None
    assert len(refusals(caplog)) == 2  # one line a minute

    fs.free_bytes = 500 * BLOCK
    assert guard.refusal(log_dir, BLOCK) is not None  # read again within the second
    fs.now += 1
    assert guard.refusal(log_dir, BLOCK) is None
    assert any("accepting produce again" in r.getMessage() for r in caplog.records)


def test_a_refusal_follows_a_reading_and_is_logged_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes admitted up to the floor lead to a reading, not to a refusal on the count
    alone: a refusal no reading saw would go unlogged if space came back within a second."""
    caplog.set_level(logging.INFO)
    fs = FakeFilesystem(monkeypatch, total_bytes=1 << 30)
    guard = FreeSpaceGuard(100 * BLOCK)
    log_dir = Path("/logs")
    fs.free_bytes = 110 * BLOCK
    assert guard.refusal(log_dir, 10 * BLOCK) is None  # the headroom, counted as used
    fs.free_bytes = 95 * BLOCK
    assert guard.refusal(log_dir, BLOCK) is not None
    assert fs.reads == 2 and len(refusals(caplog)) == 1


def test_the_default_floor_is_the_larger_of_1_gib_and_5_percent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fs = FakeFilesystem(monkeypatch, total_bytes=100 << 30)
    fs.free_bytes = 5 << 30  # 5% of 100 GiB: at the floor
    assert FreeSpaceGuard(None).refusal(Path("/big"), 1) is not None
    fs.free_bytes = (5 << 30) + BLOCK
    assert FreeSpaceGuard(None).refusal(Path("/big"), 1) is None
    fs.total_bytes, fs.free_bytes = 4 << 30, (1 << 30) - BLOCK
    assert FreeSpaceGuard(None).refusal(Path("/small"), 1) is not None


def test_a_floor_of_0_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fs = FakeFilesystem(monkeypatch, total_bytes=1 << 20)
    fs.free_bytes = 0
    assert FreeSpaceGuard(0).refusal(Path("/full"), 1 << 20) is None
    assert fs.reads == 0
