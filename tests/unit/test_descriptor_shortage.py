"""EMFILE and ENFILE are not storage failures: a segment roll or a checkpoint that fails
for want of a file descriptor leaves the log dir online, the produce is answered with a
retriable error and nothing written, and the retry rolls. Only while loading do they take
the dir offline (a dir loaded in part must not serve)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import uuid
from pathlib import Path

import pytest

from tests.unit.replicas import lead, replica_manager
from tests.unit.test_write_failures import batch, values
from tierbroker.protocol.errors import ErrorCode
from tierbroker.storage import log_manager as log_manager_module
from tierbroker.storage.local_log import LocalLog
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("d", 0)
TOPIC_ID = uuid.uuid4()
CONFIG = LogConfig(segment_bytes=1, segment_ms=10**12)  # every append but the first rolls


def too_many_open_files(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


def test_a_roll_out_of_descriptors_keeps_the_log_dir_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    manager = LogManager([tmp_path / "logs"])
    manager.load_logs(lambda tp, topic_id: CONFIG)
    replicas = replica_manager(manager)
    log = lead(replicas, TP, TOPIC_ID, CONFIG).log
    assert asyncio.run(replicas.append_records({TP: bytes(batch(0))}))[TP].error == ErrorCode.none

    with monkeypatch.context() as patched:
        patched.setattr(LocalLog, "new_segment", too_many_open_files)
        for i in (1, 2):
            failed = asyncio.run(replicas.append_records({TP: bytes(batch(i))}))[TP]
            assert failed.error == ErrorCode.kafka_storage_error
            assert failed.error_message is not None and "EMFILE" in failed.error_message
    assert manager.online_log_dirs == [tmp_path / "logs"]
    assert not any("is offline" in r.getMessage() for r in caplog.records)
    shortages = [r for r in caplog.records if "stays online" in r.getMessage()]
    assert len(shortages) == 1 and shortages[0].levelno == logging.WARNING

    retried = asyncio.run(replicas.append_records({TP: bytes(batch(3))}))[TP]
    assert (retried.error, retried.base_offset) == (ErrorCode.none, 3)
    assert len(log.segments) == 2
    assert [v[:9] for v in values(log)] == [b"value-0-%d" % n for n in range(3)] + [
        b"value-3-%d" % n for n in range(3)
    ]
    manager.shutdown()


def test_checkpoints_out_of_descriptors_keep_the_log_dir_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager([tmp_path / "logs"])
    manager.load_logs(lambda tp, topic_id: CONFIG)
    monkeypatch.setattr(log_manager_module, "_write_dir_checkpoints", too_many_open_files)
    manager.checkpoint()
    assert manager.online_log_dirs == [tmp_path / "logs"]


def test_loading_out_of_descriptors_takes_the_log_dir_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager([tmp_path / "logs"])
    monkeypatch.setattr(LogManager, "_load_dir", too_many_open_files)
    manager.load_logs(lambda tp, topic_id: CONFIG)
    assert manager.online_log_dirs == []
