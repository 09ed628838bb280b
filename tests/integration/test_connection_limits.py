"""Connection quotas, idle connections and the file limit, on a real broker process.

`max.connections.per.ip` (with its per-address overrides) closes a connection over
the limit at once; `connections.max.idle.ms` closes connections that stay silent;
a broker out of file descriptors logs a bounded number of lines about accepting,
then accepts again once connections close; connections stop short of the open file
limit, so idle ones cannot starve the logs; and a segment roll out of descriptors is
retried, never a reason to take the log dir offline.
"""

from __future__ import annotations

import os
import resource
import socket
import struct
import time
from pathlib import Path

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess, api_versions_answered
from tests.integration.waiting import wait_for
from tests.integration.wire import ConnectionClosed, WireClient

API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
FILE_LIMIT = 512  # RLIMIT_NOFILE of the broker in the descriptor tests
# Records of 1000 bytes, one a batch: a 16 KiB segment rolls every 15 or so.
ONE_RECORD_PER_BATCH = {"linger.ms": 5, "batch.size": 1500}


def answered(client: WireClient) -> bool:
    """Send ApiVersions v0; True if answered, False if the broker closed the connection."""
    try:
        client.send_frame(API_VERSIONS_V0)
        return len(client.read_frame()) > 0
    except (OSError, ConnectionClosed):
        return False


def open_answered(port: int, count: int, timeout_s: float = 10.0) -> list[WireClient]:
    """`count` connections each answered once, retrying ones rejected while the broker
    still counts connections that are closing."""
    held: list[WireClient] = []
    deadline = time.monotonic() + timeout_s
    while len(held) < count:
        assert time.monotonic() < deadline, f"only {len(held)} of {count} connections answered"
        client = WireClient(port)
        if answered(client):
            held.append(client)
        else:
            client.close()
            time.sleep(0.05)
    return held


def test_a_connection_over_the_per_ip_limit_is_closed_at_once(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(
        tmp_path,
        {"max.connections.per.ip": "1", "max.connections.per.ip.overrides": "127.0.0.1:3"},
    ).start()
    held = open_answered(broker.port, 3)
    with WireClient(broker.port) as extra:
        assert extra.is_closed(timeout_s=10)
    held.pop().close()
    open_answered(broker.port, 1)[0].close()  # a slot is free again
    for client in held:
        client.close()
    assert broker.stop() == 0
    log = broker.log()
    assert "rejected connection from 127.0.0.1: it has the maximum of 3 connections" in log, log
    assert "Traceback" not in log, log


def test_idle_connections_are_closed_after_connections_max_idle_ms(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path, {"connections.max.idle.ms": "300"}).start()
    (client,) = open_answered(broker.port, 1)
    assert client.is_closed(timeout_s=10)
    client.close()
    assert broker.stop() == 0
    assert "idle for more than 300 ms (connections.max.idle.ms)" in broker.log(), broker.log()


def test_out_of_file_descriptors_the_broker_logs_little_and_recovers(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    # No background job that opens files runs while descriptors are short: this tests accepting.
    quiet = {
        "remote.log.storage.system.enable": "false",
        "replica.high.watermark.checkpoint.interval.ms": "600000",
        "log.flush.offset.checkpoint.interval.ms": "600000",
    }
    broker = broker_factory(tmp_path, quiet).start()
    assert broker.process is not None
    pid = broker.process.pid
    open_fds = len(os.listdir(f"/proc/{pid}/fd"))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds + 8, open_fds + 8))
    log_bytes = len(broker.log())
    clients = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(50)]
    try:
        time.sleep(3)  # the broker tries to accept about 30 times in this while
        during = broker.log()[log_bytes:]
        assert 1 <= during.count("cannot accept connections: Too many open files") <= 2, during
        assert len(during) < 4096, during
    finally:
        for client in clients:
            client.close()
    assert api_versions_answered(broker.port, timeout_s=10)
    assert broker.stop() == 0
    assert "Traceback" not in broker.log(), broker.log()


def idle_connections(port: int, count: int) -> list[socket.socket]:
    """`count` connections begun without waiting: those the broker does not accept wait in
    its listen backlog (or in the SYN queue past it)."""
    held = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        held.append(s)
    return held


def test_idle_connections_leave_the_logs_their_file_descriptors(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """Under `ulimit -n 512`, 500 idle connections: the acceptor stops short of the limit
    and says so once; segments still roll, the log dir stays online, every record sent is
    acknowledged; and the connections waiting are accepted once others close."""
    broker = broker_factory(tmp_path, {"log.segment.bytes": "16384"}, file_limit=FILE_LIMIT).start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("rolling", 1, 1)])["rolling"].result(15)
    producer = Producer({"bootstrap.servers": broker.bootstrap, **ONE_RECORD_PER_BATCH})
    acked: list[int] = []
    errors: list[KafkaError] = []

    def produce(count: int) -> None:
        for _ in range(count):
            producer.produce(
                "rolling",
                b"x" * 1000,
                on_delivery=lambda e, m: errors.append(e) if e else acked.append(m.offset()),
            )
            producer.poll(0)
        assert producer.flush(60) == 0

    produce(10)  # the producer's connections are open before the idle ones come
    held = idle_connections(broker.port, 500)
    try:
        assert broker.process is not None
        wait_for(
            lambda: "accepting connections" in broker.log() or broker.process.poll() is not None,
            "the acceptor to stop",
        )
        assert broker.process.poll() is None, broker.log()
        produce(500)  # about 30 segment rolls
        assert errors == [] and sorted(acked) == list(range(510))
        assert broker.process.poll() is None, broker.log()
        log = broker.log()
        assert "is offline" not in log, log
        stopped = [line for line in log.splitlines() if "not accepting connections" in line]
        assert len(stopped) == 1 and "open file limit" in stopped[0], stopped
        assert "cannot accept connections" not in log, log
    finally:
        for s in held:
            s.close()
    assert api_versions_answered(broker.port, timeout_s=10)
    assert broker.stop() == 0
    assert "Traceback" not in broker.log(), broker.log()


def test_a_roll_out_of_file_descriptors_is_retried_not_a_disk_failure(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    """With no descriptor left, a produce that rolls a segment is answered a retriable
    KAFKA_STORAGE_ERROR and the log dir stays online; once descriptors are back, produce
    goes on at the next offset."""
    broker = broker_factory(tmp_path, {"log.segment.bytes": "16384"}).start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("rolling", 1, 1)])["rolling"].result(15)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, **ONE_RECORD_PER_BATCH, "retries": 0, "acks": "all"}
    )
    acked: list[int] = []
    errors: list[int] = []

    def produce(count: int) -> None:
        for _ in range(count):
            producer.produce(
                "rolling",
                b"x" * 1000,
                on_delivery=lambda e, m: errors.append(e.code()) if e else acked.append(m.offset()),
            )
            producer.poll(0)
        assert producer.flush(60) == 0

    produce(10)
    assert broker.process is not None
    pid = broker.process.pid
    limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    open_fds = len(os.listdir(f"/proc/{pid}/fd"))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds, limits[1]))
    try:
        produce(100)  # several rolls due: each fails
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
    assert errors and set(errors) == {KafkaError.KAFKA_STORAGE_ERROR}, errors
    produce(100)
    assert sorted(acked) == list(range(len(acked))) and len(acked) >= 110
    assert broker.process.poll() is None, broker.log()
    log = broker.log()
    assert "is offline" not in log, log
    assert "stays online" in log and "EMFILE" in log, log
    assert broker.stop() == 0
