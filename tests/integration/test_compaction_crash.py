"""kill -9 while the cleaner works, ten times: each start recovers a log whose every key
reads back with the last value acknowledged for it, at increasing offsets.

The cleaner's I/O is throttled so that a pass lasts a few seconds, and each round
overwrites every key once more, so there is always a pass to kill: the broker is
killed when the pass has written part of its new segment (a `.cleaned` file is
there), after a further random delay, so that kills land at different points of the
pass and, now and then, of the swap.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.test_restart import unexpected_tracebacks
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.slow

TOPIC = "crashes"
KEYS, VALUE_BYTES, KILLS = 250, 1000, 10
BROKER = {
    "log.cleaner.backoff.ms": "50",
    "log.cleaner.io.max.bytes.per.second": str(1 << 20),
}
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": str(128 << 10),
    "min.cleanable.dirty.ratio": "0.01",
}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path, BROKER).start()
    admin = AdminClient({"bootstrap.servers": process.bootstrap})  # alive until the result
    admin.create_topics([NewTopic(TOPIC, 1, 1, config=TOPIC_CONFIG)])[TOPIC].result(15)
    yield process
    process.kill()


def overwrite(bootstrap: str, round_: int) -> dict[str, str]:
    """Every key once more, acknowledged; the values written."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    values = {f"key-{k}": f"{round_}-{k}-".ljust(VALUE_BYTES, "x") for k in range(KEYS)}
    for key, value in values.items():
        producer.produce(TOPIC, value.encode(), key.encode())
    assert producer.flush(30) == 0
    return values


def read_back(bootstrap: str) -> list[tuple[int, str, str]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "crash-check"})
    _, end = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), 15)
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    rows: list[tuple[int, str, str]] = []
    deadline = time.monotonic() + 60
    try:
        while (not rows or rows[-1][0] < end - 1) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                rows.append((message.offset(), message.key().decode(), message.value().decode()))
    finally:
        consumer.close()
    return rows


def test_kill_9_during_cleaning_loses_no_acknowledged_key(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    partition_dir = tmp_path / "logs" / f"{TOPIC}-0"
    latest = overwrite(broker.bootstrap, 0)
    kills_mid_pass = 0
    try:
        for round_ in range(1, KILLS + 1):
            latest.update(overwrite(broker.bootstrap, round_))
            wait_for(
                lambda: list(partition_dir.glob("*.cleaned")),
                "a pass to start writing",
                timeout_s=60,
                interval_s=0.01,
            )
            time.sleep(random.uniform(0, 0.5))
            kills_mid_pass += bool(list(partition_dir.glob("*.cleaned")))
            broker.stop(signal.SIGKILL)
            assert not unexpected_tracebacks(broker.log()), broker.log()
            broker = broker.restarted()
            rows = read_back(broker.bootstrap)
            offsets = [offset for offset, _, _ in rows]
            assert offsets == sorted(set(offsets)), f"round {round_}: offsets out of order"
            assert dict((key, value) for _, key, value in rows) == latest, f"round {round_}"
        assert kills_mid_pass >= KILLS // 2  # most kills landed while a pass was writing
        # The cleaner goes on after the last restart: one record a key, and the last
        # round again in the active segment (one produce batch, so one segment).
        wait_for(lambda: len(read_back(broker.bootstrap)) <= 2 * KEYS, "a last whole pass")
        broker.stop()
        assert not unexpected_tracebacks(broker.log()), broker.log()
    finally:
        broker.kill()
