"""A broker whose remote store does not work at start: it starts, says once what to fix,
shows the store unhealthy (`tier status`, `RemoteStorageHealthy`), logs each failed copy
in one line, and turns healthy when a copy succeeds after the store is fixed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.integration.broker_process import BrokerProcess
from tests.integration.moto_server import (
    MotoServer,
    moto,  # noqa: F401 (a fixture)
)
from tests.integration.test_cli import cli
from tests.integration.tiering_helpers import metric, metrics, produce, status
from tests.integration.waiting import wait_for

FAST_RETRIES = {
    "remote.log.manager.task.interval.ms": "300",
    "remote.log.manager.task.retry.backoff.ms": "100",
    "remote.log.manager.task.retry.backoff.max.ms": "500",
}
POOL_LINE = re.compile(
    r" WARNING .* (copy|expiration) task of .* failed \(attempt \d+\), retrying in "
)
TOPIC = "later"
VALUE_SIZE = 1000


def tier_status(broker: BrokerProcess) -> dict[str, object]:
    done = cli(broker, "tier", "status", "--output", "json")
    document: dict[str, object] = json.loads(done.stdout)
    return document


def health_metric(broker: BrokerProcess) -> float | None:
    return metric(metrics(broker), "RemoteStorageHealthy")


def test_a_broker_on_a_missing_bucket_starts_warns_once_and_heals_when_it_appears(
    tmp_path: Path,
    moto: MotoServer,  # noqa: F811 (the fixture)
) -> None:
    bucket = "created-later"
    broker = BrokerProcess(tmp_path, {**moto.rsm_overrides(bucket), **FAST_RETRIES}).start()
    try:
        warnings = [line for line in broker.log().splitlines() if " WARNING " in line]
        [warning] = [line for line in warnings if "remote storage" in line]
        assert f"S3 bucket '{bucket}' at {moto.endpoint} does not exist" in warning
        assert "fix rsm.config.storage.s3.bucket.name" in warning
        table = cli(broker, "tier", "status").stdout
        assert table.startswith("remote storage: UNHEALTHY since "), table
        assert bucket in table and all(len(line) <= 80 for line in table.splitlines())
        health = tier_status(broker)["remote_storage"]
        assert isinstance(health, dict) and health["state"] == "unhealthy"
        assert "rsm.config.storage.s3.bucket.name" in health["error"]
        assert health_metric(broker) == 0

        # The local tier works without it; copies fail, one line each, and back off.
        cli(
            broker,
            *("topic", "create", TOPIC, "-p", "1"),
            *("--config", "remote.storage.enable=true", "--config", "segment.bytes=65536"),
        )
        produce(broker.bootstrap, TOPIC, 0, 1000, VALUE_SIZE)
        wait_for(
            lambda: (
                (metric(metrics(broker), "RemoteCopyErrorsPerSec_total", topic=TOPIC) or 0) >= 3
            ),
            "three failed copies",
            60,
        )
        # Each failure is one line of its pool (copies, and expiration deleting what a failed
        # copy could not), and the remote tier logs nothing else: no retries, no clean-ups.
        lines = broker.log().splitlines()
        remote = [
            line
            for line in lines[lines.index(warning) + 1 :]
            if " tierbroker.rlm." in line or " tierbroker.storage.remote." in line
        ]
        failures = [line for line in remote if POOL_LINE.search(line)]
        assert remote == failures, remote
        assert all(bucket in line for line in failures)
        copies = [line for line in failures if " copy task of " in line]
        assert len(copies) >= 2 and "Traceback" not in broker.log()  # the third may be logging
        for attempt, line in enumerate(copies[:2], start=1):
            assert f"failed (attempt {attempt}), retrying in 0.50s: PutObject " in line, line
            assert line.endswith("fix rsm.config.storage.s3.bucket.name"), line

        # Fixed: the next copy succeeds, and the health says so.
        moto.create_bucket(bucket)
        wait_for(lambda: status(broker, TOPIC).get("remote_segments"), "a copied segment", 60)
        health = tier_status(broker)["remote_storage"]
        assert isinstance(health, dict) and (health["state"], health["error"]) == ("healthy", None)
        assert health_metric(broker) == 1
        assert cli(broker, "tier", "status").stdout.startswith("remote storage: healthy")
        assert "remote storage works again" in broker.log()
    finally:
        broker.stop()
    assert "Traceback" not in broker.log(), broker.log()


def test_an_unwritable_remote_dir_is_a_warning_and_the_broker_serves(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    remote = tmp_path / "a-file" / "remote"
    broker = BrokerProcess(tmp_path, {"rsm.config.dir": str(remote), **FAST_RETRIES}).start()
    try:
        [warning] = [line for line in broker.log().splitlines() if "remote storage" in line]
        assert " WARNING " in warning and f"remote dir {remote} is not writable" in warning
        assert "fix rsm.config.dir" in warning
        health = tier_status(broker)["remote_storage"]
        assert isinstance(health, dict) and health["state"] == "unhealthy"
        assert "rsm.config.dir" in health["error"] and health["error"] in warning
        assert health_metric(broker) == 0
        cli(broker, "produce", "plain", stdin="a\nb\n")  # the local tier serves
        assert cli(broker, "consume", "plain", "-e").stdout.splitlines() == ["a", "b"]
    finally:
        broker.stop()
    assert "Traceback" not in broker.log(), broker.log()
