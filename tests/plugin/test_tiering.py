"""The remote tier through the plugin: segments reach it (`wait_tiered`), consumers read
them back from offset 0 through the broker in their rack once the local tier deleted
them, and an object-store outage (`pause_remote`) holds up tiering only: produce and
reads of the local tier go on, copies fail and are retried, and everything is tiered
once the store is back. On the shared racked cluster of the conftest (LocalFs tier),
and on an S3 endpoint (moto's server standing in for one a user gives)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import boto3
import pytest

from tests.integration.moto_server import CREDENTIALS, REGION, MotoServer
from tierbroker.testing import S3Tier, TierbrokerCluster

RECORD = b"." * 200
SMALL_SEGMENTS = {"segment.bytes": 4096, "local.retention.ms": 100}


def numbered(start: int, end: int) -> list[bytes]:
    return [b"%d:" % i + RECORD for i in range(start, end)]


def produce_in_batches(cluster: TierbrokerCluster, topic: str, start: int, end: int) -> None:
    """Small produce calls, so batches stay smaller than a segment and segments roll."""
    for first in range(start, end, 10):
        cluster.produce(topic, numbered(first, min(first + 10, end)), partition=0)


def test_consumers_read_a_tiered_topic_from_offset_0(racked_cluster: TierbrokerCluster) -> None:
    cluster = racked_cluster
    cluster.create_topic("clicks", config=SMALL_SEGMENTS)
    produce_in_batches(cluster, "clicks", 0, 200)

    tiers = cluster.wait_tiered("clicks")[0]
    assert tiers.remote_segments > 0 and tiers.copy_lag_segments == 0
    cluster.wait_for(
        lambda: cluster.tier_state("clicks")[0].local_log_start_offset > 0,
        "local retention deleting tiered segments",
    )

    assert [r.value for r in cluster.records("clicks")] == numbered(0, 200)
    follower = next(b for b in cluster.brokers if b.broker_id != cluster.leader("clicks"))
    read = cluster.records("clicks", client_rack=follower.rack)
    assert [r.value for r in read] == numbered(0, 200)
    served = cluster.metric(
        "ConsumerBytesOut_total", broker=follower.broker_id, topic="clicks", locality="same-rack"
    )
    assert served >= sum(len(v) for v in numbered(0, 200))


def test_an_object_store_outage_holds_up_tiering_only(racked_cluster: TierbrokerCluster) -> None:
    cluster = racked_cluster
    cluster.create_topic("orders", config={"segment.bytes": 4096})
    produce_in_batches(cluster, "orders", 0, 100)
    before = cluster.wait_tiered("orders")[0]
    errors = cluster.metric("RemoteCopyErrorsPerSec_total", topic="orders")

    cluster.pause_remote()
    try:
        produce_in_batches(cluster, "orders", 100, 200)  # produce goes on
        cluster.wait_for(
            lambda: cluster.metric("RemoteCopyErrorsPerSec_total", topic="orders") > errors,
            "a failed copy",
        )
        during = cluster.tier_state("orders")[0]
        assert during.copy_lag_segments > 0
        assert during.remote_log_end_offset == before.remote_log_end_offset
        assert cluster.metric("RemoteStorageHealthy", broker=cluster.leader("orders")) == 0
        assert [r.value for r in cluster.records("orders")] == numbered(0, 200)
    finally:
        cluster.resume_remote()

    after = cluster.wait_tiered("orders")[0]
    assert after.copy_lag_segments == 0
    assert after.remote_log_end_offset > before.remote_log_end_offset
    assert cluster.metric("RemoteStorageHealthy", broker=cluster.leader("orders")) == 1


async def test_waiting_for_tiering_from_an_async_test(racked_cluster: TierbrokerCluster) -> None:
    cluster = racked_cluster.aio
    await cluster.create_topic("metrics", partitions=2, config={"segment.bytes": 4096})
    for first in range(0, 200, 10):
        await cluster.produce("metrics", numbered(first, first + 10))

    tiers = await cluster.wait_tiered("metrics")

    assert set(tiers) == {0, 1}
    assert sum(t.remote_segments for t in tiers.values()) > 0
    read = [await cluster.records("metrics", partition) for partition in (0, 1)]
    assert sorted(r.value for records in read for r in records) == sorted(numbered(0, 200))


@pytest.fixture
def s3_bucket() -> Iterator[S3Tier]:
    server = MotoServer().start()
    try:
        boto3.client(
            "s3", endpoint_url=server.endpoint, region_name=REGION, **CREDENTIALS
        ).create_bucket(Bucket="tiered")
        yield S3Tier(
            server.endpoint,
            "tiered",
            REGION,
            CREDENTIALS["aws_access_key_id"],
            CREDENTIALS["aws_secret_access_key"],
        )
    finally:
        server.stop()


def test_tiering_to_an_s3_endpoint(
    tierbroker_cluster: Callable[..., TierbrokerCluster], s3_bucket: S3Tier
) -> None:
    cluster = tierbroker_cluster(s3=s3_bucket)
    cluster.create_topic("audit", config=SMALL_SEGMENTS)
    produce_in_batches(cluster, "audit", 0, 120)

    tiers = cluster.wait_tiered("audit")[0]

    assert tiers.remote_segments > 0
    s3 = boto3.client("s3", endpoint_url=s3_bucket.endpoint, region_name=REGION, **CREDENTIALS)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="tiered").get("Contents", [])]
    assert sum(key.endswith(".log") for key in keys) >= tiers.remote_segments
    assert [r.value for r in cluster.records("audit")] == numbered(0, 120)
