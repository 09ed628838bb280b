"""A start that fails while loading logs must not mark them cleanly shut down: after a
crash that left a torn tail, a failed start, then a good one, the log is recovered (the
torn bytes cut off), everything acknowledged is there once, and the log goes on."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.broker_process import BrokerProcess
from tests.integration.test_disk_full import AckingProducer, assert_exactly_acked, create_topic
from tests.integration.test_disk_full import read_all as read_partition

TORN_BYTES = 100


def test_failed_start_keeps_the_next_start_recovering(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path).start()
    create_topic(broker.bootstrap, "t")
    producer = AckingProducer(broker.bootstrap, "t")
    producer.produce(300)
    assert producer.errors == [] and len(producer.acked) == 300
    broker.stop(signal.SIGKILL)

    # The crash tore the tail: the first bytes of a batch, the rest never written.
    log_dir = tmp_path / "logs"
    segment = log_dir / "t-0" / f"{0:020d}.log"
    valid_size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(segment.read_bytes()[:TORN_BYTES])

    # A start that fails while loading: an unreadable checkpoint.
    checkpoint = log_dir / "log-start-offset-checkpoint"
    checkpoint.write_text("not a checkpoint\n")
    with pytest.raises(RuntimeError, match="exited with 1"):
        broker.restarted()
    assert not (log_dir / ".kafka_cleanshutdown").exists()
    assert checkpoint.read_text() == "not a checkpoint\n"  # nothing half-written over it

    checkpoint.unlink()  # the operator's fix
    broker = broker.restarted()
    assert f"truncated {TORN_BYTES} invalid bytes" in broker.log()
    assert segment.stat().st_size == valid_size
    got = read_partition(broker.bootstrap, "t")
    assert_exactly_acked(got, producer.acked)
    more = AckingProducer(broker.bootstrap, "t", first_seq=producer.seq)
    more.produce(100)
    assert more.errors == [] and sorted(more.acked) == list(range(300, 400))
    assert_exactly_acked(read_partition(broker.bootstrap, "t"), {**producer.acked, **more.acked})
    assert broker.stop() == 0
