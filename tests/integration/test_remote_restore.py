"""A tiered topic restored from its bucket alone, and the bucket scrubbed.

The lost cluster, honestly: three brokers tier a topic to S3 (moto's server), then the
cluster is stopped and its data thrown away, metadata store included (each
`TierbrokerCluster` has its own); a new, empty cluster of three brokers starts on the
same bucket (the same `rsm.config.cluster.id`: the bucket's layout names it), and
`tierbroker remote restore` recreates the topic. Deleting a tiered topic from a live
cluster would delete its remote data too, so that is not the scenario a restore is for.

What the bucket held is read back identically from each partition's log start, with
confluent-kafka through the brokers and with the Spark source from the bucket; the
log start a DeleteRecords set before the loss holds after it; produce goes on after
the restored history, and followers rebuild from the remote tier into the ISR.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from tests.integration.moto_server import CREDENTIALS, MotoServer
from tests.spark_session import spark_session
from tierbroker.broker.cli.main import app
from tierbroker.testing.cluster import S3Tier, TierbrokerCluster

pytestmark = pytest.mark.slow

TOPIC = "restored"
BUCKET = "restore-bucket"
PARTITIONS = 3
SETTINGS = {"rsm.config.cluster.id": "prod"}
TOPIC_CONFIG = {"segment.bytes": "20000", "retention.ms": "-1", "local.retention.ms": "1000"}
DELETED_BELOW = 25  # partition 1's log start, set by DeleteRecords before the loss


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = MotoServer().start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()


def s3(moto: MotoServer) -> S3Tier:
    return S3Tier(
        moto.endpoint,
        BUCKET,
        access_key_id=CREDENTIALS["aws_access_key_id"],
        secret_access_key=CREDENTIALS["aws_secret_access_key"],
    )


def storage_args(moto: MotoServer) -> list[str]:
    return [
        "--storage",
        f"s3://{BUCKET}/?endpoint={moto.endpoint}&path_style=true",
        "--option",
        f"storage.aws.access.key.id={CREDENTIALS['aws_access_key_id']}",
        "--option",
        f"storage.aws.secret.access.key={CREDENTIALS['aws_secret_access_key']}",
    ]


def partition_index(moto: MotoServer, partition: int) -> dict[str, Any] | None:
    client = moto.client()
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="prod/")
    for item in listed.get("Contents", []):
        if item["Key"].endswith(f"/{partition}/partition.json"):
            body = client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
            document: dict[str, Any] = json.loads(body)
            return document
    return None


def rows(records: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.offset, r.key, r.value, r.headers, r.timestamp_ms) for r in records]


@pytest.fixture(scope="module")
def lost(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[Any]]:
    """The records of each partition's remote history, from its log start, as the lost
    cluster served them."""
    cluster = TierbrokerCluster(
        tmp_path_factory.mktemp("lost"), 3, s3=s3(moto), broker_config=SETTINGS
    ).start()
    try:
        cluster.create_topic(TOPIC, PARTITIONS, config=TOPIC_CONFIG)
        for p in range(PARTITIONS):
            for first in range(0, 400, 20):  # a batch each: segments roll every 20 KB
                values = [
                    (f"k{i}".encode(), f"p{p}-{i}-".encode() * 40) for i in range(first, first + 20)
                ]
                cluster.produce(TOPIC, values, partition=p, headers={"h": b"v"})
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        futures = admin.delete_records([TopicPartition(TOPIC, 1, DELETED_BELOW)])
        for future in futures.values():
            future.result(30)
        tiers = cluster.wait_tiered(TOPIC)
        cluster.wait_for(
            lambda: (partition_index(moto, 1) or {}).get("log_start_offset") == DELETED_BELOW,
            "partition 1's index records its log start",
            30,
        )
        history = {}
        for p, tier in tiers.items():
            start = DELETED_BELOW if p == 1 else 0
            records = cluster.records(TOPIC, p, from_offset=start)
            history[p] = [r for r in records if r.offset <= tier.remote_log_end_offset]
            assert history[p], f"partition {p} has nothing in the remote tier"
        return history
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def restored(
    moto: MotoServer, lost: dict[int, list[Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TierbrokerCluster, Any]]:
    cluster = TierbrokerCluster(
        tmp_path_factory.mktemp("new"), 3, s3=s3(moto), broker_config=SETTINGS
    ).start()
    try:
        done = CliRunner().invoke(
            app,
            [
                "remote",
                "restore",
                "--topic",
                TOPIC,
                *storage_args(moto),
                "-b",
                cluster.bootstrap_servers,
                "--replication-factor",
                "3",
                "--output",
                "json",
            ],
        )
        assert done.exit_code == 0, done.output
        yield cluster, json.loads(done.stdout)
    finally:
        cluster.stop()


def test_restore_reports_each_partition_from_the_bucket(
    restored: tuple[TierbrokerCluster, Any], lost: dict[int, list[Any]]
) -> None:
    _, report = restored
    by_partition = {r["partition"]: r for r in report["partitions"]}
    assert sorted(by_partition) == list(range(PARTITIONS))
    for p, records in lost.items():
        row = by_partition[p]
        assert row["segments"] > 0 and row["bytes"] > 0
        assert row["end_offset"] == records[-1].offset + 1
        assert row["log_start_offset"] == records[0].offset


def test_consumers_read_the_restored_history_as_the_lost_cluster_served_it(
    restored: tuple[TierbrokerCluster, Any], lost: dict[int, list[Any]]
) -> None:
    cluster, _ = restored
    for p, records in lost.items():
        again = cluster.records(TOPIC, p, from_offset=records[0].offset)
        assert rows(again) == rows(records), f"partition {p} differs"
    assert cluster.tier_state(TOPIC)[1].log_start_offset == DELETED_BELOW


def test_the_spark_source_reads_the_restored_bucket_as_before(
    moto: MotoServer, restored: tuple[TierbrokerCluster, Any], lost: dict[int, list[Any]]
) -> None:
    options = {
        "storage": f"s3://{BUCKET}/?endpoint={moto.endpoint}&path_style=true",
        "subscribe": TOPIC,
        "storage.aws.access.key.id": CREDENTIALS["aws_access_key_id"],
        "storage.aws.secret.access.key": CREDENTIALS["aws_secret_access_key"],
    }
    with spark_session("tierbroker-restore") as spark:
        frame = spark.read.format("tierbroker").options(**options).load()
        found = {
            (r["partition"], r["offset"]): (bytes(r["key"]), bytes(r["value"]))
            for r in frame.select("partition", "offset", "key", "value").collect()
        }
    wanted = {(p, r.offset): (r.key, r.value) for p, rs in lost.items() for r in rs}
    assert {k: v for k, v in found.items() if k in wanted} == wanted


def test_produce_continues_after_the_history_and_followers_rebuild(
    restored: tuple[TierbrokerCluster, Any], lost: dict[int, list[Any]]
) -> None:
    cluster, _ = restored
    for p, records in lost.items():
        produced = cluster.produce(TOPIC, [b"after the restore"], partition=p)
        assert produced == [(p, records[-1].offset + 1)]
        (tail,) = cluster.records(TOPIC, p, from_offset=records[-1].offset + 1)
        assert tail.value == b"after the restore"
    cluster.wait_for(
        lambda: cluster.embedded.read(lambda: cluster._topic_ready(TOPIC)),
        f"every replica of {TOPIC} in its ISR",
        60,
    )


def test_verify_reports_orphans_and_a_missing_object_and_deletes_only_the_orphans(
    moto: MotoServer, restored: tuple[TierbrokerCluster, Any]
) -> None:
    """Runs last: it damages the bucket."""
    client = moto.client()
    keys = [i["Key"] for i in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    clean = CliRunner().invoke(app, ["remote", "verify", *storage_args(moto), "--grace-ms", "0"])
    assert clean.exit_code == 0, clean.output
    indexes = sorted(k for k in keys if k.endswith(".indexes"))
    missing = indexes[0]
    client.delete_object(Bucket=BUCKET, Key=missing)
    partition_prefix = missing.rsplit("/", 1)[0]
    orphans = [f"{partition_prefix}/{n:020d}-crashedcopy{n}.log" for n in (900001, 900002)]
    for key in orphans:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"a crashed copy's leftovers")

    args = ["remote", "verify", *storage_args(moto), "--grace-ms", "0", "--output", "json"]
    damaged = CliRunner().invoke(app, args)
    assert damaged.exit_code == 1, damaged.output
    found = {(p["kind"], p["key"]) for p in json.loads(damaged.stdout)["problems"]}
    assert found == {("missing", missing), *(("orphan", k) for k in orphans)}

    cleaned = CliRunner().invoke(app, [*args, "--delete-orphans"])
    assert cleaned.exit_code == 1, "the missing object is still wrong"
    assert sorted(json.loads(cleaned.stdout)["deleted"]) == sorted(orphans)
    left = {i["Key"] for i in client.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert left == set(keys) - {missing}
