"""Cold reads of the remote tier from an S3 endpoint with a round trip (moto's server, 10 ms
a request): ten stock consumers reading a partition's history at once are fed by one GET
per chunk, and each reads it whole and in order."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.moto_server import MotoServer
from tests.integration.tiering_helpers import status
from tests.integration.waiting import wait_for

CHUNK = 1 << 20
RECORDS = 16_000  # of 1 KiB: about 16 MiB, 8 segments
CONSUMERS = 10


def read_all(bootstrap: str, topic: str, into: list[bytes]) -> None:
    """Every record's key of partition 0 from offset 0, as a stock consumer reads them."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "cold", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    deadline = time.monotonic() + 120
    try:
        while len(into) < RECORDS and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                if m.error() is not None:
                    raise RuntimeError(str(m.error()))
                into.append(m.key())
    finally:
        consumer.close()


def test_ten_cold_consumers_fetch_each_chunk_once(tmp_path: Path) -> None:
    moto = MotoServer(latency_ms=10).start()
    moto.create_bucket("cold")
    broker = BrokerProcess(
        tmp_path,
        {
            **moto.rsm_overrides("cold"),
            "rsm.config.chunk.size": str(CHUNK),
            "remote.log.manager.task.interval.ms": "300",
            "log.retention.check.interval.ms": "300",
        },
    ).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {
            "remote.storage.enable": "true",
            "segment.bytes": str(2 << 20),
            "local.retention.bytes": str(1 << 20),
        }
        admin.create_topics([NewTopic("history", 1, 1, config=config)])["history"].result(15)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        value = bytes(range(256)) * 4
        for i in range(RECORDS):
            producer.produce("history", value, b"%d" % i, partition=0)
            producer.poll(0)
        assert producer.flush(60) == 0
        wait_for(
            lambda: (
                (s := status(broker, "history"))
                and s["copy_lag_segments"] == 0
                and s["local_log_start_offset"] > RECORDS // 2
            ),
            "the history to be in the remote tier only",
        )
        broker.stop()
        broker = broker.restarted()  # nothing cached in memory: every chunk is cold
        asked = len(moto.requests())

        reads: list[list[bytes]] = [[] for _ in range(CONSUMERS)]
        threads = [
            threading.Thread(target=read_all, args=(broker.bootstrap, "history", keys))
            for keys in reads
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        expected = [b"%d" % i for i in range(RECORDS)]
        assert all(keys == expected for keys in reads), [len(keys) for keys in reads]
        listed = moto.client().list_objects_v2(Bucket="cold")["Contents"]
        chunks = {
            f"/cold/{o['Key']}": -(-o["Size"] // CHUNK) for o in listed if o["Key"].endswith(".log")
        }
        got = collections.Counter(
            path for method, path in moto.requests()[asked:] if method == "GET" and path in chunks
        )
        assert len(chunks) >= 4
        assert got == chunks, "a chunk was fetched more than once, or not at all"
    finally:
        broker.kill()
        moto.stop()
