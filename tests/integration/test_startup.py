"""`tierbroker serve` as a user meets it: the defaults, the errors of a start that cannot
go ahead, free ports found through the ports file, and what the broker logs."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

from tests.integration.broker_process import ROOT, BrokerProcess, executable
from tests.integration.tiering_helpers import (
    LocalFsTier,
    check_records,
    produce,
    read_confluent,
    status,
)
from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient
from tierbroker.storage.remote.local_fs import LocalFsRemoteStorageManager

# Start-up mistakes: overrides ({taken}: a port in use, {file}: a regular file), the
# property the one line must name, and more words it must hold.
MISTAKES: dict[str, tuple[list[str], str, list[str]]] = {
    "broker port in use": (
        ["listeners=PLAINTEXT://127.0.0.1:{taken}"],
        "listeners",
        ["is in use", "0 picks a free one"],
    ),
    "metrics port in use": (["metrics.port={taken}"], "metrics.port", ["is in use"]),
    "listener without a protocol": (
        ["listeners=CLIENTS://127.0.0.1:0"],
        "listeners",
        ["no security protocol", "listener.security.protocol.map"],
    ),
    "garbage listener": (["listeners=localhost"], "listeners", ["NAME://host:port"]),
    "port out of range": (
        ["listeners=PLAINTEXT://127.0.0.1:65536"],
        "listeners",
        ["out of range"],
    ),
    "metrics port out of range": (["metrics.port=99999"], "metrics.port", ["out of range"]),
    "log dir that cannot be created": (
        ["log.dirs={file}/data"],
        "log.dirs",
        ["cannot be created", "is not a directory"],
    ),
    "log dir that is a file": (["log.dirs={file}"], "log.dirs", ["is not a directory"]),
    "storage plugin that does not load": (
        ["remote.log.storage.manager.class.name=nosuch.Plugin"],
        "remote.log.storage.manager.class.name",
        ["No module named 'nosuch'", "use localfs, s3, or package.module.Class"],
    ),
    "metadata plugin that does not load": (
        ["remote.log.metadata.manager.class.name=tierbroker.NoSuchManager"],
        "remote.log.metadata.manager.class.name",
        ["use topic, or package.module.Class"],
    ),
    "missing plugin setting": (
        ["remote.log.storage.manager.class.name=s3"],
        "rsm.config.storage.s3.bucket.name",
        ["is required"],
    ),
    "unknown property": (["listners=PLAINTEXT://:0"], "listners", ["did you mean 'listeners'?"]),
    "boolean that is not true or false": (
        ["remote.log.storage.system.enable=yes"],
        "remote.log.storage.system.enable",
        ["must be true or false"],
    ),
}


def serve(tmp_path: Path, overrides: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`tierbroker serve` without --config, in `tmp_path`, its data in `tmp_path`/data, on
    free ports (unless `overrides` say otherwise)."""
    command = [executable("tierbroker", "pip install -e ."), "serve", *args]
    defaults = [f"log.dirs={tmp_path / 'data'}", "listeners=PLAINTEXT://127.0.0.1:0"]
    for override in [*defaults, "metrics.port=0", *overrides]:
        command += ["--override", override]
    env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(ROOT / ".hypothesis")}
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process listens on."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("mistake", MISTAKES, ids=MISTAKES)
def test_a_start_up_mistake_is_one_line_naming_the_property_and_nothing_is_written(
    mistake: str, tmp_path: Path, taken_port: int
) -> None:
    overrides, prop, words = MISTAKES[mistake]
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    done = serve(tmp_path, [o.format(taken=taken_port, file=a_file) for o in overrides])
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and prop in line, line
    for word in words:
        assert word in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no data dir, nothing


def test_debug_adds_the_traceback_to_the_one_line(tmp_path: Path) -> None:
    done = serve(tmp_path, ["listeners=CLIENTS://127.0.0.1:0"], "--debug")
    assert done.returncode == 2
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.splitlines()[-1].startswith(
        "error: listeners='CLIENTS://127.0.0.1:0': listener CLIENTS has no security protocol"
    )


class ExplodingStorage(LocalFsRemoteStorageManager):
    """A storage plugin whose configure() fails as no check could foresee."""

    def configure(self, configs: object) -> None:
        raise RuntimeError("exploded on purpose")


def test_an_unexpected_error_at_start_is_one_line_with_a_hint(tmp_path: Path) -> None:
    plugin = [
        f"remote.log.storage.manager.class.name={__name__}.ExplodingStorage",
        f"remote.log.storage.manager.class.path={ROOT}",
    ]
    done = serve(tmp_path, plugin)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: unexpected RuntimeError: exploded on purpose (rerun with --debug for the traceback)"
    )
    with_debug = serve(tmp_path, plugin, "--debug")
    assert with_debug.returncode == 1
    assert "Traceback (most recent call last):" in with_debug.stderr
    assert 'raise RuntimeError("exploded on purpose")' in with_debug.stderr


def test_a_port_0_broker_advertises_the_ports_it_bound(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path)  # listeners=PLAINTEXT://127.0.0.1:0, metrics.port=0
    broker.start()
    try:
        [ports] = json.loads(broker.ports_file.read_text())
        assert ports == {
            "broker_id": 0,
            "host": "127.0.0.1",
            "port": broker.port,
            "metrics_port": broker.metrics_port,
            "listeners": [
                {
                    "name": "PLAINTEXT",
                    "security_protocol": "PLAINTEXT",
                    "host": "127.0.0.1",
                    "port": broker.port,
                }
            ],
        }
        assert broker.port > 0 and broker.metrics_port > 0
        log = broker.log()
        assert (
            f"listening: PLAINTEXT (PLAINTEXT) on 127.0.0.1:{broker.port}, advertised as "
            f"127.0.0.1:{broker.port}; inter-broker listener PLAINTEXT" in log
        )
        assert f"metrics on http://127.0.0.1:{broker.metrics_port}/metrics" in log

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        [broker_metadata] = admin.list_topics(timeout=10).brokers.values()
        assert (broker_metadata.host, broker_metadata.port) == ("127.0.0.1", broker.port)
        [node] = admin.describe_cluster(request_timeout=10).result(10).nodes
        assert (node.host, node.port) == ("127.0.0.1", broker.port)
        with WireClient(broker.port) as client:
            [coordinator] = client.request(
                FindCoordinatorRequest(key_type=0, coordinator_keys=("g",))
            ).coordinators
        assert (coordinator.host, coordinator.port) == ("127.0.0.1", broker.port)

        # A group consumer reaches the coordinator, and the partition leader, at what was
        # advertised.
        admin.create_topics([NewTopic("t", 1, 1)])["t"].result(10)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(10):
            producer.produce("t", f"value {i}".encode())
        assert producer.flush(10) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "g",
                "auto.offset.reset": "earliest",
            }
        )
        try:
            consumer.subscribe(["t"])
            values = []
            for _ in range(60):
                values += [m.value() for m in consumer.consume(10, 0.5) if m.error() is None]
                if len(values) == 10:
                    break
            committed = consumer.commit(asynchronous=False)
        finally:
            consumer.close()
        assert values == [f"value {i}".encode() for i in range(10)]
        assert [p.offset for p in committed] == [10]
    finally:
        assert broker.stop() == 0
    assert not broker.ports_file.exists()


def test_without_config_the_broker_tiers_into_its_data_dir_and_serves_metrics(
    tmp_path: Path,
) -> None:
    fast = {"remote.log.manager.task.interval.ms": "300", "log.retention.check.interval.ms": "300"}
    broker = BrokerProcess(tmp_path, fast, config=None).start()
    tier = LocalFsTier(tmp_path)  # <data dir>/remote
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        tiered = {"remote.storage.enable": "true", "segment.bytes": "65536"}
        admin.create_topics([NewTopic("events", 1, 1, config=tiered)])["events"].result(10)
        produce(broker.bootstrap, "events", 0, 500, 1000, batch_size=16384)
        # Every rolled segment copied: a copy cut short by the stop would be made again
        # after the restart, under a new id, as Kafka does.
        wait_for(
            lambda: (
                status(broker, "events").get("remote_segments", 0) >= 3
                and status(broker, "events").get("copy_lag_segments") == 0
            ),
            "every rolled segment in the remote tier",
            show=lambda: status(broker, "events"),
        )
        objects = tier.segment_objects("events")
        assert len(objects) >= 3
        assert broker.stop() == 0

        # Loading the log dir leaves the remote tier inside it alone.
        broker = broker.restarted()
        assert tier.segment_objects("events") == objects
        check_records(read_confluent(broker.bootstrap, "events", 0, 500).records, 0, 500, 1000)
    finally:
        broker.stop()
    assert "Traceback" not in broker.log()


def test_the_start_up_summary(tmp_path: Path) -> None:
    overrides = {
        "num.io.threads": "8",
        "log.segment.bytes": "1048576",
        "rsm.config.storage.aws.secret.access.key": "not-to-be-seen",
    }
    broker = BrokerProcess(tmp_path, overrides).start()
    broker.stop()
    lines = [
        line.split(": ", 1)[1] for line in broker.log().splitlines() if "broker_server:" in line
    ]
    version = importlib.metadata.version("tierbroker")
    summary = next(i for i, line in enumerate(lines) if line.startswith("tierbroker "))
    assert re.fullmatch(
        rf"tierbroker {re.escape(version)}: broker 0 of cluster \S+", lines[summary]
    )
    listening, log_dirs, remote, settings, ignored = lines[summary + 1 : summary + 6]
    assert listening.startswith(f"listening: PLAINTEXT (PLAINTEXT) on 127.0.0.1:{broker.port}")
    assert log_dirs == f"log dirs: {tmp_path / 'logs'}"
    assert remote == (
        "remote tier: storage localfs "
        "(tierbroker.storage.remote.local_fs.LocalFsRemoteStorageManager) "
        f"in {tmp_path / 'logs' / 'remote'}, metadata topic"
    )
    assert settings.startswith("non-default settings: ")
    shown = settings.removeprefix("non-default settings: ").split(", ")
    assert "log.segment.bytes=1048576" in shown
    assert "group.initial.rebalance.delay.ms=0" in shown  # from the shipped config
    assert "rsm.config.storage.aws.secret.access.key=[hidden]" in shown
    assert "not-to-be-seen" not in broker.log()
    assert ignored == "Kafka configs without effect in tierbroker (ignored): num.io.threads"


REQUEST_LINE = re.compile(
    r"DEBUG tierbroker\.request: Completed request: (\w+) v(\d+) correlation_id=(\d+) "
    r"client_id='([^']*)' from 127\.0\.0\.1:\d+ in \d+\.\d{3} ms$"
)


def test_the_request_log_is_one_line_per_request_when_asked_for(tmp_path: Path) -> None:
    asked = BrokerProcess(
        tmp_path / "asked", serve_args=("--log-level", "tierbroker.request=DEBUG")
    )
    everything = BrokerProcess(tmp_path / "debug", serve_args=("--log-level", "DEBUG"))
    for broker in (asked, everything):
        broker.data_dir.mkdir()
        broker.start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap, "client.id": "reader"})
            admin.list_topics(timeout=10)
        finally:
            broker.stop()
    logged = [m.groups() for line in asked.log().splitlines() if (m := REQUEST_LINE.search(line))]
    assert ("ApiVersions", "3", "1", "reader") in logged
    assert any(api == "Metadata" and client == "reader" for api, _, _, client in logged)
    # --log-level DEBUG alone leaves the request log off, as Kafka's request logger is.
    assert "Completed request" not in everything.log()
    assert "DEBUG" in everything.log()


def test_the_ports_file_lists_every_broker_of_the_process(tmp_path: Path) -> None:
    """And SIGTERM stops all of them cleanly, removing the file, with not one warning; each
    line a broker logs names it."""
    broker = BrokerProcess(tmp_path, serve_args=("--brokers", "3"))
    broker.start()  # reads the first broker's ports
    try:
        brokers = json.loads(broker.ports_file.read_text())
        assert [b["broker_id"] for b in brokers] == [0, 1, 2]
        assert len({b["port"] for b in brokers} | {b["metrics_port"] for b in brokers}) == 6
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        listed = admin.list_topics(timeout=10).brokers.values()
        assert sorted((b.id, b.host, b.port) for b in listed) == [
            (b["broker_id"], "127.0.0.1", b["port"]) for b in brokers
        ]
        assert (tmp_path / "logs" / "broker-1").is_dir()
        assert (tmp_path / "logs" / "remote").is_dir()  # one remote tier, shared
        assert broker.stop(timeout_s=30) == 0, broker.log()
        assert not broker.ports_file.exists()
        lines = broker.log().splitlines()
        assert [line for line in lines if " WARNING " in line or " ERROR " in line] == []
        tagged = {m[1] for line in lines if (m := re.search(r"\] INFO \[broker (\d)\] ", line))}
        assert tagged == {"0", "1", "2"}
    finally:
        broker.kill()
