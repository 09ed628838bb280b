"""The cost meter's parts: request and byte counts per topic (from many threads), their
Prometheus series, fetch bytes by tier and rack, the `/tier/usage` document, price tables
and the arithmetic of a topic's cost."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tierbroker.broker.cli.prices import (
    DEFAULTS,
    GB,
    PriceTableError,
    price_tables,
    select,
    topic_cost,
)
from tierbroker.broker.config.listeners import Listener, SecurityProtocol
from tierbroker.broker.handlers import fetch
from tierbroker.broker.metadata.zk_data import BrokerRegistration
from tierbroker.broker.metrics.served_bytes import Direction, ServedBytesMeter, Tier, direction
from tierbroker.broker.metrics.tier_usage import tier_usage
from tierbroker.broker.metrics.topic_metrics import BrokerTopicMetrics
from tierbroker.broker.replication.fetch_reader import (
    FetchParams,
    FetchRequestPartition,
    FetchResultPartition,
)
from tierbroker.broker.replication.replica_selector import ClientMetadata
from tierbroker.protocol.errors import ErrorCode
from tierbroker.rlm.metrics import RemoteStorageMetrics
from tierbroker.storage.remote.request_meter import (
    ObjectStoreMeter,
    ObjectStoreUsage,
    RequestKind,
    Transfer,
)
from tierbroker.storage.topic_partition import TopicPartition

PLAINTEXT = Listener("PLAINTEXT", SecurityProtocol.PLAINTEXT, "h", 1)


def test_counts_from_many_threads_add_up_per_topic_and_kind() -> None:
    meter = ObjectStoreMeter()

    def count(topic: str) -> None:
        for _ in range(5000):
            meter.request(topic, RequestKind.GET)
            meter.transferred(topic, Transfer.DOWNLOAD, 3)
        meter.request(topic, RequestKind.PUT)

    threads = [threading.Thread(target=count, args=(f"t{i % 2}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    usage = meter.usage()
    assert usage.keys() == {"t0", "t1"}
    for topic in ("t0", "t1"):
        assert usage[topic].requests == {RequestKind.GET: 20_000, RequestKind.PUT: 4}
        assert usage[topic].bytes == {Transfer.DOWNLOAD: 60_000}


def test_prometheus_shows_the_meter_and_a_deleted_topic_leaves_it() -> None:
    registry = CollectorRegistry()
    meter = ObjectStoreMeter()
    metrics = RemoteStorageMetrics(registry, meter)
    meter.request("events", RequestKind.PUT)
    meter.request("events", RequestKind.PUT)
    meter.transferred("events", Transfer.UPLOAD, 4096)
    meter.request("other", RequestKind.DELETE)
    text = generate_latest(registry).decode()
    assert 'RemoteStorageRequestsPerSec_total{kind="put",topic="events"} 2.0' in text
    assert 'RemoteStorageRequestsPerSec_total{kind="delete",topic="other"} 1.0' in text
    assert 'RemoteStorageBytesPerSec_total{direction="upload",topic="events"} 4096.0' in text

    metrics.forget(TopicPartition("events", 0), topic_deleted=False)
    assert "events" in meter.usage()  # only its partition left this broker
    metrics.forget(TopicPartition("events", 0), topic_deleted=True)
    assert meter.usage().keys() == {"other"}
    assert 'topic="events"' not in generate_latest(registry).decode()


@pytest.mark.parametrize(
    ("broker_rack", "reader_rack", "expected"),
    [
        ("az1", "az1", Direction.SAME_RACK),
        ("az1", "az2", Direction.CROSS_RACK),
        ("az1", None, Direction.CROSS_RACK),  # a reader without a rack: cannot be placed
        ("az1", "", Direction.CROSS_RACK),
        (None, "az1", Direction.CROSS_RACK),
        (None, None, Direction.CROSS_RACK),  # no racks anywhere: an upper bound
    ],
)
def test_only_a_known_equal_rack_is_same_rack(
    broker_rack: str | None, reader_rack: str | None, expected: Direction
) -> None:
    assert direction(broker_rack, reader_rack) is expected


def test_served_bytes_by_tier_and_direction_on_prometheus() -> None:
    registry = CollectorRegistry()
    served = ServedBytesMeter(registry)
    served.served("events", Tier.REMOTE, Direction.CROSS_RACK, 1000)
    served.served("events", Tier.REMOTE, Direction.CROSS_RACK, 24)
    served.served("events", Tier.LOCAL, Direction.SAME_RACK, 7)
    assert served.usage() == {
        "events": {(Tier.REMOTE, Direction.CROSS_RACK): 1024, (Tier.LOCAL, Direction.SAME_RACK): 7}
    }
    text = generate_latest(registry).decode()
    assert (
        'BytesOutByTierPerSec_total{direction="cross-rack",tier="remote",topic="events"} 1024.0'
        in text
    )
    served.forget("events")
    assert served.usage() == {}


def test_usage_document_names_every_count_zeros_included() -> None:
    document = tier_usage(
        {"a": ObjectStoreUsage(requests={RequestKind.GET: 2}, bytes={Transfer.DOWNLOAD: 9})},
        {"b": {(Tier.LOCAL, Direction.CROSS_RACK): 5}},
        {"a": 100},
    )
    assert document == {
        "topics": {
            "a": {
                "requests": {"put": 0, "get": 2, "list": 0, "delete": 0},
                "object_store_bytes": {"upload": 0, "download": 9},
                "bytes_out": {
                    "local": {"same-rack": 0, "cross-rack": 0},
                    "remote": {"same-rack": 0, "cross-rack": 0},
                },
                "remote_bytes": 100,
            },
            "b": {
                "requests": {"put": 0, "get": 0, "list": 0, "delete": 0},
                "object_store_bytes": {"upload": 0, "download": 0},
                "bytes_out": {
                    "local": {"same-rack": 0, "cross-rack": 5},
                    "remote": {"same-rack": 0, "cross-rack": 0},
                },
                "remote_bytes": 0,
            },
        }
    }


def usage(**counts: int) -> dict[str, object]:
    return {
        "requests": {k: counts.get(k, 0) for k in ("put", "get", "list", "delete")},
        "object_store_bytes": {
            "upload": counts.get("upload", 0),
            "download": counts.get("download", 0),
        },
        "bytes_out": {
            "local": {
                "same-rack": counts.get("local_same", 0),
                "cross-rack": counts.get("local_cross", 0),
            },
            "remote": {"same-rack": 0, "cross-rack": counts.get("remote_cross", 0)},
        },
        "remote_bytes": counts.get("stored", 0),
    }


def test_cost_at_s3_standard() -> None:
    cost = topic_cost(
        DEFAULTS["s3-standard"],
        usage(
            put=2000,
            get=10_000,
            list=1000,
            delete=500,
            upload=5 * GB,
            download=GB,
            local_same=7 * GB,
            local_cross=GB,
            remote_cross=2 * GB,
            stored=100 * GB,
        ),
    )
    # 2,000 + 1,000 PUT-class at $0.005/1,000, 10,000 GETs at $0.0004/1,000, deletes free.
    assert cost.requests == pytest.approx(0.015 + 0.004)
    # 3 GB across zones at $0.02 (both sides); the store's bytes are free on S3 Standard.
    assert cost.transfer == pytest.approx(0.06)
    assert cost.storage_per_month == pytest.approx(2.3)
    assert cost.total == pytest.approx(0.019 + 0.06 + 2.3)


def test_s3_express_charges_the_bytes_to_and_from_the_store() -> None:
    cost = topic_cost(
        DEFAULTS["s3-express-one-zone"], usage(put=1000, get=1000, upload=10 * GB, download=GB)
    )
    assert cost.requests == pytest.approx(0.00113 + 0.00003)
    assert cost.transfer == pytest.approx(10 * 0.0032 + 0.0006)


def test_a_price_file_changes_a_default_in_part_and_adds_whole_tables(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    mine = {f: 0.5 for f in ("put_per_1000", "get_per_1000", "list_per_1000")}
    mine |= {"delete_per_1000": 0, "storage_per_gb_month": 0.01, "cross_zone_per_gb": 0}
    path.write_text(json.dumps({"s3-standard": {"cross_zone_per_gb": 0}, "minio": mine}))
    tables = price_tables(path)
    assert tables["s3-standard"] == dataclasses.replace(
        DEFAULTS["s3-standard"], cross_zone_per_gb=0
    )
    assert select(tables, "minio").upload_per_gb == 0  # optional fields default to free
    assert tables["gcs-standard"] == DEFAULTS["gcs-standard"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{", ("cannot read price file",)),
        ("[]", ("expected an object",)),
        ('{"s3-standard": {"put_per_1k": 1}}', ("unknown field 'put_per_1k'", "put_per_1000")),
        ('{"s3-standard": {"get_per_1000": -1}}', ("get_per_1000 must be a number >= 0",)),
        ('{"s3-standard": {"get_per_1000": "1"}}', ("get_per_1000 must be a number",)),
        ('{"r2": {"put_per_1000": 1}}', ("new table 'r2' lacks", "get_per_1000")),
    ],
)
def test_a_bad_price_file_is_refused_saying_what_to_fix(
    tmp_path: Path, content: str, words: tuple[str, ...]
) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(PriceTableError) as refused:
        price_tables(path)
    assert str(path) in str(refused.value)
    for word in words:
        assert word in str(refused.value)


def test_an_unknown_table_name_lists_the_known_ones() -> None:
    with pytest.raises(PriceTableError, match="gcs-standard, s3-express-one-zone, s3-standard"):
        select(price_tables(), "azure")


@pytest.mark.parametrize(
    ("replica_id", "client_rack", "expected"),
    [
        (-1, "az1", Direction.SAME_RACK),  # a consumer in this broker's rack
        (-1, "", Direction.CROSS_RACK),  # a consumer that names no rack
        (2, "", Direction.SAME_RACK),  # broker 2, registered in az1
        (3, "", Direction.CROSS_RACK),  # broker 3, in az2
        (4, "", Direction.CROSS_RACK),  # a follower the metadata does not know (yet)
    ],
)
def test_a_fetch_counts_each_partition_by_tier_and_its_readers_rack(
    replica_id: int, client_rack: str, expected: Direction
) -> None:
    registry = CollectorRegistry()
    ctx = SimpleNamespace(
        config=SimpleNamespace(broker_rack="az1"),
        metadata=SimpleNamespace(
            brokers={
                2: BrokerRegistration(2, (PLAINTEXT,), "az1"),
                3: BrokerRegistration(3, (PLAINTEXT,), "az2"),
            }
        ),
        topic_metrics=BrokerTopicMetrics(registry),
    )
    params = FetchParams(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        replica_id=replica_id,
        client=ClientMetadata(client_rack, "c", "127.0.0.1") if replica_id < 0 else None,
    )
    requested = [FetchRequestPartition(TopicPartition("events", p), 0, 1 << 20) for p in range(3)]
    results = [
        FetchResultPartition(ErrorCode.none, records=memoryview(b"r" * 100)),  # remote
        FetchResultPartition(ErrorCode.none),  # nothing read: not counted
        FetchResultPartition(ErrorCode.none, records=memoryview(b"s" * 20)),
    ]
    fetch._count_bytes_out(ctx, params, requested, results)  # type: ignore[arg-type]
    assert ctx.topic_metrics.served.usage() == {"events": {(Tier.REMOTE, expected): 120}}
    consumer_bytes = metric_value(registry, "BytesOutPerSec_total")
    assert consumer_bytes == (120 if replica_id < 0 else None)  # Kafka's meter: consumers only


def metric_value(registry: CollectorRegistry, name: str) -> float | None:
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None
