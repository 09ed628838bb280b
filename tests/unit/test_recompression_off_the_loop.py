"""A produce that re-encodes a large request for the topic's `compression.type` does it in a
worker, not on the event loop, and a partition's appends still land in arrival order."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import pytest

from tests.unit.replicas import lead, replica_manager
from tierbroker.broker.replication.leader_appends import RECOMPRESS_IN_WORKER_BYTES
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import Compression, build_batch, decode_batch, iter_batches
from tierbroker.protocol.records import recompress as recompress_module
from tierbroker.storage import log_validator
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.topic_partition import TopicPartition

TP = TopicPartition("gz", 0)


def batch(value: bytes, count: int, producer_sequence: int | None = None) -> bytes:
    return build_batch(
        [(None, value, [], 1_000)] * count,
        compression=Compression.NONE,
        **(
            {"producer_id": 9, "producer_epoch": 0, "base_sequence": producer_sequence}
            if producer_sequence is not None
            else {}
        ),
    )


def test_a_large_request_is_re_encoded_off_the_loop_and_appends_keep_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager([tmp_path])
    manager.load_logs(lambda tp, topic_id: LogConfig())
    replicas = replica_manager(manager)
    lead(replicas, TP, uuid.uuid4(), LogConfig(compression_type="gzip"))
    threads: list[str] = []
    real = recompress_module.recompress

    def recording(*args: object, **kwargs: object) -> bytearray:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(log_validator, "recompress", recording)
    large = batch(b"x" * 1024, RECOMPRESS_IN_WORKER_BYTES // 1024 + 1, producer_sequence=0)
    small = batch(b"small", 3, producer_sequence=RECOMPRESS_IN_WORKER_BYTES // 1024 + 1)

    async def produce() -> list[int]:
        # Sent one after the other, as a producer pipelines them: the large first.
        first = asyncio.ensure_future(replicas.append_records({TP: large}))
        second = asyncio.ensure_future(replicas.append_records({TP: small}))
        results = [(await first)[TP], (await second)[TP]]
        assert [r.error for r in results] == [ErrorCode.none, ErrorCode.none]
        return [r.base_offset for r in results]

    offsets = asyncio.run(produce())

    assert offsets == [0, RECOMPRESS_IN_WORKER_BYTES // 1024 + 1]
    # The large request in a worker; the small one, cheap, on the loop (after it).
    assert len(threads) == 2
    assert threads[0] != threading.main_thread().name
    assert threads[1] == threading.main_thread().name
    stored = manager.logs[TP].read(0, 1 << 24, 1 << 40, min_one_batch=True).records
    assert stored is not None
    batches = list(iter_batches(stored.read()))
    assert [b.compression for b in batches] == [Compression.GZIP, Compression.GZIP]
    assert len(decode_batch(batches[0]).records) == RECOMPRESS_IN_WORKER_BYTES // 1024 + 1
