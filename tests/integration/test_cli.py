"""The everyday commands (`tierbroker topic|produce|consume|group|cluster|tier status`) run as
a user runs them, against one real broker, with kcat and confluent-kafka on the other side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from tests.integration.broker_process import BrokerProcess, executable, free_port
from tests.integration.test_kcat import kcat
from tests.integration.tiering_helpers import LocalFsTier
from tierbroker.broker.cli import topics
from tierbroker.broker.cli.main import app
from tierbroker.broker.cli.metrics_endpoint import get_json

CLI_TIMEOUT_S = 60
FAST_TIERING = {
    "remote.log.manager.task.interval.ms": "300",
    "log.retention.check.interval.ms": "300",
}
# The cleaner looks once at start, before any test's topic exists, then not again while
# the module runs: a compacted topic stays as dirty as it was written.
NO_CLEANING = {"log.cleaner.backoff.ms": "3600000"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker with a local-filesystem remote tier and an idle log cleaner, shared by
    the module's tests (each uses its own topics and groups)."""
    data_dir = tmp_path_factory.mktemp("cli")
    overrides = {**LocalFsTier(data_dir).overrides(), **FAST_TIERING, **NO_CLEANING}
    process = BrokerProcess(data_dir, overrides)
    process.start()
    yield process
    process.stop()
    assert "Traceback" not in process.log(), process.log()


def cli(
    broker: BrokerProcess | None, *args: str, stdin: str | None = None, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the installed `tierbroker` with TIERBROKER_BOOTSTRAP pointing at `broker`."""
    env = {**os.environ, "COLUMNS": "80"}
    if broker is not None:
        env["TIERBROKER_BOOTSTRAP"] = broker.bootstrap
    done = subprocess.run(
        [executable("tierbroker", "pip install -e ."), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=CLI_TIMEOUT_S,
    )
    if ok:
        assert done.returncode == 0, f"tierbroker {' '.join(args)}: {done.stderr}"
    return done


def cli_json(broker: BrokerProcess, *args: str) -> Any:
    return json.loads(cli(broker, *args, "--output", "json").stdout)


def assert_one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode != 0
    assert done.stderr.startswith("error: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    for word in words:
        assert word in done.stderr


def configs(description: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["value"], c["source"]) for c in description["configs"]}


def test_topic_create_describe_alter_delete(broker: BrokerProcess) -> None:
    cli(
        broker,
        "topic",
        "create",
        "t-admin",
        "-p",
        "3",
        "-r",
        "1",
        "--config",
        "retention.ms=3600000",
    )

    listed = {t["name"]: t for t in cli_json(broker, "topic", "list")}
    assert listed["t-admin"] == {"name": "t-admin", "partitions": 3, "replication_factor": 1}
    described = cli_json(broker, "topic", "describe", "t-admin")
    assert described["partitions"] == [
        {"partition": p, "leader": 0, "replicas": [0], "isr": [0]} for p in range(3)
    ]
    assert configs(described)["retention.ms"] == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    table = cli(broker, "topic", "describe", "t-admin").stdout
    assert "retention.ms" in table and "3600000" in table
    assert all(len(line) <= 80 for line in table.splitlines())

    cli(
        broker,
        "topic",
        "alter-config",
        "t-admin",
        "--config",
        "segment.bytes=1048576",
        "--delete-config",
        "retention.ms",
    )
    after = configs(cli_json(broker, "topic", "describe", "t-admin"))
    assert after["segment.bytes"] == ("1048576", "DYNAMIC_TOPIC_CONFIG")
    assert after["retention.ms"][1] != "DYNAMIC_TOPIC_CONFIG"

    cli(broker, "topic", "add-partitions", "t-admin", "--partitions", "5")
    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics("t-admin", 10)
    assert len(metadata.topics["t-admin"].partitions) == 5  # as a stock client sees it
    assert_one_line_error(
        cli(broker, "topic", "add-partitions", "t-admin", "-p", "2", ok=False),
        "add partitions to t-admin",
    )

    cli(broker, "topic", "delete", "t-admin")
    assert "t-admin" not in {t["name"] for t in cli_json(broker, "topic", "list")}
    assert_one_line_error(
        cli(broker, "topic", "describe", "t-admin", ok=False), "describe topic t-admin"
    )


def test_describe_shows_how_dirty_each_compacted_partition_is(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Eligible for cleaning at once (only the backoff keeps the cleaner away); segments
    # of 1 KiB: the second produce request rolls partition 0's first segment.
    cli(
        broker,
        "topic",
        "create",
        "t-compacted",
        "-p",
        "2",
        *("--config", "cleanup.policy=compact"),
        *("--config", "segment.bytes=1024"),
        *("--config", "min.cleanable.dirty.ratio=0.01"),
    )
    for _ in range(2):
        lines = "".join(f"k{i}:{'v' * 50}\n" for i in range(10))
        cli(broker, "produce", "t-compacted", "-K", ":", "-p", "0", stdin=lines)

    leader = get_json(f"http://127.0.0.1:{broker.metrics_port}/cleaner/status", 10)
    rows = {r["partition"]: r for r in leader if r["topic"] == "t-compacted"}
    assert rows[0]["first_dirty_offset"] == 0 and rows[0]["cleanable_bytes"] > 0
    assert [rows[p]["dirty_ratio"] for p in (0, 1)] == [1.0, 0.0]
    described = cli_json(broker, "topic", "describe", "t-compacted")
    assert [p["dirty_ratio"] for p in described["partitions"]] == [1.0, 0.0]
    table = cli(broker, "topic", "describe", "t-compacted").stdout.splitlines()
    assert table[1].split() == ["partition", "leader", "replicas", "isr", "dirty"], table
    assert [line.split()[-1] for line in table[3:5]] == ["100.0%", "0.0%"], table
    assert all(len(line) <= 80 for line in table)

    def no_answer(url: str, timeout_s: float) -> None:
        raise ConnectionRefusedError(f"{url}: refused")

    monkeypatch.setattr(topics, "get_json", no_answer)  # a leader whose endpoint is down
    done = CliRunner().invoke(app, ["topic", "describe", "t-compacted", "-b", broker.bootstrap])
    assert done.exit_code == 0, done.output
    assert [line.split()[-1] for line in done.output.splitlines()[3:5]] == ["-", "-"]


def test_cli_produces_keys_and_headers_that_kcat_reads(broker: BrokerProcess) -> None:
    cli(broker, "topic", "create", "t-produce", "-p", "1")
    lines = ["k1:v1", "k2:value:with:colons ünïcödé", "no key here", ":empty key"]
    cli(
        broker,
        "produce",
        "t-produce",
        "-K",
        ":",
        "--header",
        "h1=a",
        "--header",
        "h2=b=c",
        stdin="\n".join(lines) + "\n",
    )
    out = kcat(broker.bootstrap, "-C", "-t", "t-produce", "-e", "-q", "-f", "%k|%s|%h\n")
    assert out.splitlines() == [
        "k1|v1|h1=a,h2=b=c",
        "k2|value:with:colons ünïcödé|h1=a,h2=b=c",
        "|no key here|h1=a,h2=b=c",
        "|empty key|h1=a,h2=b=c",
    ]


def test_kcat_produces_what_the_cli_consumes(broker: BrokerProcess) -> None:
    cli(broker, "topic", "create", "t-consume", "-p", "2")
    lines = [f"key-{i}:value {i} ünïcödé" for i in range(100)]
    stdin = "\n".join(lines) + "\n"
    kcat(broker.bootstrap, "-P", "-t", "t-consume", "-p", "1", "-K:", "-H", "src=kcat", stdin=stdin)

    out = cli(broker, "consume", "t-consume", "--exit", "-K", ":").stdout
    assert out.splitlines() == lines
    headers = cli(broker, "consume", "t-consume", "-e", "--print-headers", "-c", "1").stdout
    assert headers == "value 0 ünïcödé\tsrc=kcat\n"
    assert cli(broker, "consume", "t-consume", "-p", "1", "-o", "-2", "-e").stdout.splitlines() == [
        "value 98 ünïcödé",
        "value 99 ünïcödé",
    ]
    assert cli(broker, "consume", "t-consume", "-o", "97", "-e", "-f", "%p %o %k\\n").stdout == (
        "1 97 key-97\n1 98 key-98\n1 99 key-99\n"
    )
    assert cli(broker, "consume", "t-consume", "-p", "0", "-o", "end", "-e").stdout == ""
    records = [
        json.loads(line)
        for line in cli(
            broker, "consume", "t-consume", "-c", "2", "--output", "json"
        ).stdout.splitlines()
    ]
    assert [(r["partition"], r["offset"], r["key"], r["value"], r["headers"]) for r in records] == [
        (1, 0, "key-0", "value 0 ünïcödé", [["src", "kcat"]]),
        (1, 1, "key-1", "value 1 ünïcödé", [["src", "kcat"]]),
    ]


def test_group_describe_and_reset_offsets(broker: BrokerProcess) -> None:
    cli(broker, "topic", "create", "t-group", "-p", "1")
    cli(broker, "produce", "t-group", stdin="".join(f"{i}\n" for i in range(20)))
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "g-cli",
            "client.id": "cli-test-consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe(["t-group"])
        consumed = 0
        deadline = time.monotonic() + 30
        while consumed < 10 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                consumed += 1
        assert consumed == 10
        consumer.commit(offsets=[TopicPartition("t-group", 0, 10)], asynchronous=False)

        active = cli_json(broker, "group", "describe", "g-cli")
        assert active["state"] == "STABLE"
        assert [m["client_id"] for m in active["members"]] == ["cli-test-consumer"]
        [row] = active["partitions"]
        assert (row["committed_offset"], row["log_end_offset"], row["lag"]) == (10, 20, 10)
        assert row["client_id"] == "cli-test-consumer"
        assert_one_line_error(
            cli(broker, "group", "reset-offsets", "g-cli", "--to-earliest", "--execute", ok=False),
            "stable",
        )
    finally:
        consumer.close()

    assert {"group": "g-cli", "state": "EMPTY", "simple": False} in cli_json(
        broker, "group", "list"
    )
    dry_run = cli_json(broker, "group", "reset-offsets", "g-cli", "--to-earliest")
    assert dry_run["executed"] is False
    assert [(p["committed_offset"], p["new_offset"]) for p in dry_run["partitions"]] == [(10, 0)]
    assert cli_json(broker, "group", "describe", "g-cli")["partitions"][0]["committed_offset"] == 10

    for option, expected in (
        (["--to-earliest"], 0),
        (["--to-offset", "15"], 15),
        (["--to-offset", "99"], 20),  # kept within the log
        (["--shift-by", "-5"], 15),
        (["--shift-by", "-99"], 0),  # kept within the log
        (["--to-datetime", "2100-01-01T00:00:00"], 20),  # nothing that late: the log end
        (["--to-datetime", "2000-01-01T00:00:00+00:00"], 0),
        (["--to-latest"], 20),
    ):
        cli(broker, "group", "reset-offsets", "g-cli", "-t", "t-group", *option, "--execute")
        [row] = cli_json(broker, "group", "describe", "g-cli")["partitions"]
        assert (row["committed_offset"], row["lag"]) == (expected, 20 - expected)
    table = cli(broker, "group", "describe", "g-cli").stdout
    assert "t-group" in table and "empty" in table
    cli(broker, "group", "delete", "g-cli")
    assert "g-cli" not in [g["group"] for g in cli_json(broker, "group", "list")]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = admin.list_consumer_groups().result(10).valid
    assert "g-cli" not in [g.group_id for g in listed]  # as a stock client sees it


def test_consume_as_a_group_resumes_from_its_commits(broker: BrokerProcess) -> None:
    cli(broker, "topic", "create", "t-resume", "-p", "2")
    lines = [f"k{i}:{i}" for i in range(10)]
    cli(broker, "produce", "t-resume", "-K", ":", stdin="".join(f"{x}\n" for x in lines))

    def read(*args: str) -> list[str]:
        return cli(broker, "consume", "t-resume", "-G", "g-resume", "-K", ":", *args).stdout.split()

    first = read("-c", "4")
    assert len(first) == 4
    rest = read("-e")
    assert sorted(first + rest, key=lambda x: int(x.split(":")[1])) == lines
    assert read("-e") == []  # everything is committed
    rows = cli_json(broker, "group", "describe", "g-resume")["partitions"]
    assert sum(r["committed_offset"] for r in rows) == 10
    cli(broker, "group", "reset-offsets", "g-resume", "--to-earliest", "--execute")
    assert sorted(read("-e")) == sorted(lines)


def test_cluster_info(broker: BrokerProcess) -> None:
    info = cli_json(broker, "cluster", "info")
    assert info["cluster_id"]
    assert info["controller"] == 0
    assert info["brokers"] == [{"id": 0, "host": "127.0.0.1", "port": broker.port, "rack": None}]
    # -b wins over the environment
    table = cli(None, "cluster", "info", "-b", broker.bootstrap).stdout
    assert f"127.0.0.1:{broker.port}" in table and info["cluster_id"] in table


def test_cluster_config_describes_a_broker_and_alters_its_dynamic_configs(
    broker: BrokerProcess,
) -> None:
    described = cli_json(broker, "cluster", "config", "describe", "--broker", "0")
    shown = {c["name"]: c for c in described["configs"]}
    assert shown["listeners"]["source"] == "STATIC_BROKER_CONFIG"
    assert all(c["source"] != "DEFAULT_CONFIG" for c in described["configs"])
    every = cli_json(broker, "cluster", "config", "describe", "--broker", "0", "--all-configs")
    assert len(every["configs"]) > len(described["configs"])
    # The topic defaults are dynamic: set, shown with their source, then removed.
    cli(broker, "cluster", "config", "alter", "--broker", "0", "--config", "log.roll.ms=3600000")
    shown = {
        c["name"]: c
        for c in cli_json(broker, "cluster", "config", "describe", "--broker", "0")["configs"]
    }
    assert (shown["log.roll.ms"]["value"], shown["log.roll.ms"]["source"]) == (
        "3600000",
        "DYNAMIC_BROKER_CONFIG",
    )
    cli(broker, "cluster", "config", "alter", "--broker", "0", "--delete-config", "log.roll.ms")
    refused = cli(
        broker,
        "cluster",
        "config",
        "alter",
        "--broker",
        "0",
        "--config",
        "num.partitions=3",
        ok=False,
    )
    assert_one_line_error(refused, "alter configs of broker 0", "dynamically")


def test_partition_elect_leaders_answers_per_partition(broker: BrokerProcess) -> None:
    cli(broker, "topic", "create", "t-elect", "-p", "2")
    elected = cli_json(broker, "partition", "elect-leaders", "-t", "t-elect")
    assert elected == {
        "topic": "t-elect",
        "election": "preferred",
        "partitions": [
            {"partition": p, "result": "already led by its preferred replica"} for p in (0, 1)
        ],
    }
    assert_one_line_error(
        cli(broker, "partition", "elect-leaders", "-t", "t-none", ok=False),
        "elect leaders of t-none",
    )
    missing = cli(broker, "partition", "elect-leaders", "-t", "t-elect", "-p", "7", ok=False)
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PART" in missing.stdout


def test_tier_status_finds_the_broker_and_fits_80_columns(broker: BrokerProcess) -> None:
    cli(
        broker,
        "topic",
        "create",
        "t-tiered-with-a-long-name",
        "-p",
        "1",
        "--config",
        "remote.storage.enable=true",
        "--config",
        f"segment.bytes={256 * 1024}",
    )
    for _ in range(4):  # four produce requests: a segment rolls before each after the first
        cli(broker, "produce", "t-tiered-with-a-long-name", stdin=("y" * 400 + "\n") * 500)
    deadline = time.monotonic() + 30
    while True:
        status = cli_json(broker, "tier", "status", "--topic", "t-tiered-with-a-long-name")
        rows = status["partitions"]
        if (rows and rows[0]["remote_segments"] > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    [row] = rows
    assert row["log_end_offset"] == 2000 and row["remote_segments"] > 0
    assert status["remote_storage"]["state"] == "healthy"
    table = cli(broker, "tier", "status").stdout
    assert "t-tiered" in table and "2000" in table
    assert table.startswith("remote storage: healthy")
    assert all(len(line) <= 80 for line in table.splitlines()), table


def test_txn_finds_and_aborts_a_hanging_transaction(broker: BrokerProcess) -> None:
    """A transaction left open: `txn list` and `describe` show it ongoing, `producers`
    where it starts, and `abort --start-offset` ends it on the partition, as
    kafka-transactions.sh does."""
    cli(broker, "topic", "create", "t-txn", "-p", "1")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx-cli"})
    p.init_transactions(CLI_TIMEOUT_S)
    p.begin_transaction()
    p.produce("t-txn", b"committed")
    p.commit_transaction(CLI_TIMEOUT_S)  # the record at 0, its marker at 1
    p.begin_transaction()
    p.produce("t-txn", b"left open")
    p.flush(CLI_TIMEOUT_S)

    [listed] = [
        t
        for t in cli_json(broker, "txn", "list", "--state", "Ongoing")
        if t["transactional_id"] == "tx-cli"
    ]
    described = cli_json(broker, "txn", "describe", "tx-cli")
    assert described["state"] == "Ongoing" and described["partitions"] == ["t-txn-0"]
    assert described["producer_id"] == listed["producer_id"]
    [producer] = cli_json(broker, "txn", "producers", "-t", "t-txn", "-p", "0")
    assert producer["producer_id"] == listed["producer_id"]
    assert producer["current_txn_start_offset"] == 2

    assert_one_line_error(
        cli(broker, "txn", "abort", "-t", "t-txn", "-p", "0", "--start-offset", "1", ok=False),
        "no transaction open at offset 1",
    )
    assert cli(broker, "txn", "abort", "-t", "t-txn", "-p", "0", ok=False).returncode == 2
    cli(broker, "txn", "abort", "-t", "t-txn", "-p", "0", "--start-offset", "2")
    [producer] = cli_json(broker, "txn", "producers", "-t", "t-txn", "-p", "0")
    assert producer["current_txn_start_offset"] == -1
    committed = cli(broker, "consume", "t-txn", "-e", "--isolation-level", "read_committed")
    assert committed.stdout.splitlines() == ["committed"]
    assert cli(broker, "consume", "t-txn", "-e").stdout.splitlines() == ["committed", "left open"]


def test_errors_are_one_line(broker: BrokerProcess) -> None:
    assert_one_line_error(
        cli(broker, "consume", "t-missing", "-e", ok=False), "unknown topic t-missing"
    )
    assert_one_line_error(
        cli(broker, "group", "describe", "g-missing", ok=False), "g-missing", "no such group"
    )
    down = f"127.0.0.1:{free_port()}"
    for args in (["topic", "list"], ["consume", "t-missing"], ["tier", "status"]):
        done = cli(None, *args, "-b", down, "--timeout", "2", ok=False)
        assert_one_line_error(done, f"cannot reach {down}")


def test_serve_does_not_load_the_client_library() -> None:
    check = (
        "import sys, tierbroker.broker.cli.main, tierbroker.broker.server.broker_server;"
        "sys.exit('confluent_kafka' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", check], timeout=CLI_TIMEOUT_S).returncode == 0
