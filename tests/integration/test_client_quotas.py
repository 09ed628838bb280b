"""Client quotas with stock tools and clients: Kafka's `kafka-configs` alters and
describes them against tierbroker as against Apache Kafka; a producer and a consumer
over their byte-rate quotas are throttled (they see throttle times, and their rate
stays near the quota), while clients without a quota are not."""

from __future__ import annotations

import datetime
import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kio.static.primitive import f64, i8

from tests.apache_kafka import run_tool
from tests.integration.kafka_tools import unique
from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient, request_module
from tierbroker.protocol.errors import ErrorCode
from tierbroker.testing import cluster_fixture
from tierbroker.testing.cluster import TierbrokerCluster

# kafka-python 3 loads its protocol schemas with importlib.resources' deprecated calls:
# the library's warning, not the broker's (filterwarnings=error), at import and later.
LEGACY_RESOURCES = "(read|open)_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    from kafka import KafkaConsumer
pytestmark = pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning")

QUOTA_BYTES = 200_000  # per second
VALUE = b"x" * 10_000
# Two samples of a second: the burst a quota lets through first is short, so the
# throttled rate shows within seconds.
quota_broker = cluster_fixture(
    "module", broker_config={"quota.window.num": "2", "quota.window.size.seconds": "1"}
)


def configs(bootstrap: str, *args: str) -> str:
    return run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", bootstrap, *args)


def test_kafka_configs_alters_and_describes_client_quotas(kafka_broker: str) -> None:
    user, client = unique("user"), unique("client")
    named = ("--entity-type", "users", "--entity-name", user)
    clients = ("--entity-type", "clients")
    rates = "producer_byte_rate=1024,consumer_byte_rate=2048"
    configs(
        kafka_broker, "--alter", *named, *clients, "--entity-name", client, "--add-config", rates
    )
    configs(
        kafka_broker,
        "--alter",
        *named,
        *clients,
        "--entity-default",
        "--add-config",
        "request_percentage=50",
    )
    configs(kafka_broker, "--alter", *clients, "--entity-name", client, "--add-config", rates)
    both = configs(kafka_broker, "--describe", *named, *clients)
    assert sorted(both.splitlines()) == [
        f"Quota configs for user-principal '{user}', client-id '{client}' are "
        "consumer_byte_rate=2048.0, producer_byte_rate=1024.0",
        f"Quota configs for user-principal '{user}', the default client-id are "
        "request_percentage=50.0",
    ]
    configs(kafka_broker, "--alter", *named, "--add-config", "consumer_byte_rate=4096")
    user_only = configs(kafka_broker, "--describe", *named)
    assert user_only == (
        f"Quota configs for user-principal '{user}' are consumer_byte_rate=4096.0\n"
    )
    described = configs(kafka_broker, "--describe", *clients, "--entity-name", client)
    assert described == (
        f"Quota configs for client-id '{client}' are "
        "consumer_byte_rate=2048.0, producer_byte_rate=1024.0\n"
    )
    configs(
        kafka_broker,
        "--alter",
        *clients,
        "--entity-name",
        client,
        "--delete-config",
        "producer_byte_rate,consumer_byte_rate",
    )
    assert configs(kafka_broker, "--describe", *clients, "--entity-name", client) == ""
    with pytest.raises(AssertionError) as refused:
        configs(
            kafka_broker,
            "--alter",
            *clients,
            "--entity-name",
            client,
            "--add-config",
            "producer_byte_rate=10.5",
        )
    assert "producer_byte_rate cannot be a fractional value" in str(refused.value)


@pytest.fixture
def throttled_client(quota_broker: TierbrokerCluster) -> Iterator[str]:
    """A client id with byte-rate quotas for producing and consuming."""
    client = unique("throttled")
    rates = f"producer_byte_rate={QUOTA_BYTES},consumer_byte_rate={QUOTA_BYTES}"
    entity = ("--entity-type", "clients", "--entity-name", client)
    configs(quota_broker.bootstrap_servers, "--alter", *entity, "--add-config", rates)
    yield client
    configs(
        quota_broker.bootstrap_servers,
        "--alter",
        *entity,
        "--delete-config",
        "producer_byte_rate,consumer_byte_rate",
    )


def _produce_for(bootstrap: str, topic: str, client_id: str, seconds: float) -> tuple[int, int]:
    """Produce as fast as acknowledged for `seconds` after a second of warm-up; the bytes
    acknowledged in that time, and the largest throttle the client's statistics showed."""
    acked = [0]
    throttle_ms = [0]

    def stats(text: str) -> None:
        for broker in json.loads(text)["brokers"].values():
            throttle_ms[0] = max(throttle_ms[0], broker["throttle"]["max"])

    def delivered(error: object, message: object) -> None:
        if error is None:
            acked[0] += len(VALUE)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 5,
            "statistics.interval.ms": 500,
            "stats_cb": stats,
            "queue.buffering.max.kbytes": 1024,
        }
    )
    warm_up_end = time.monotonic() + 1
    end = warm_up_end + seconds
    counted_from = 0
    while time.monotonic() < end:
        try:
            producer.produce(topic, VALUE, on_delivery=delivered)
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
        if not counted_from and time.monotonic() >= warm_up_end:
            counted_from = acked[0] or 1
    counted = acked[0] - counted_from
    producer.purge()  # what waits in the client's queue is not counted: not sent in time
    producer.flush(30)
    return counted, throttle_ms[0]


def test_a_producer_over_its_quota_is_throttled(
    quota_broker: TierbrokerCluster, throttled_client: str
) -> None:
    topic = unique("produce-quota")
    quota_broker.create_topic(topic, 1)
    seconds = 5
    free_bytes, free_throttle = _produce_for(
        quota_broker.bootstrap_servers, topic, unique("free"), seconds
    )
    assert free_throttle == 0
    throttled_bytes, throttle_ms = _produce_for(
        quota_broker.bootstrap_servers, topic, throttled_client, seconds
    )
    assert throttle_ms > 0
    # Not a timing bound: unthrottled, the same producer sends ten times the quota or more.
    assert free_bytes > 10 * QUOTA_BYTES * seconds
    assert throttled_bytes < 2 * QUOTA_BYTES * seconds


def test_a_consumer_over_its_quota_is_throttled(
    quota_broker: TierbrokerCluster, throttled_client: str
) -> None:
    topic = unique("fetch-quota")
    quota_broker.create_topic(topic, 1)
    # Batches well below what the quota lets through in a window: a larger one could never
    # be sent within the quota (as in Kafka, whose fetch returns at least one batch).
    producer = Producer({"bootstrap.servers": quota_broker.bootstrap_servers, "batch.size": 16_384})
    for _ in range(1500):  # 15 MB, more than the consumer may read in the time
        producer.produce(topic, VALUE)
        producer.poll(0)
    assert producer.flush(60) == 0
    seconds = 5
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=quota_broker.bootstrap_servers,
        client_id=throttled_client,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    try:
        wait_for(lambda: consumer.poll(timeout_ms=500), "the first records", timeout_s=30)
        read = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for records in consumer.poll(timeout_ms=200).values():
                read += sum(len(r.value) for r in records)
        # kafka-python 3 keeps the throttle times of every response, per connection.
        throttles = [
            value
            for group in consumer.metrics().values()
            for name, value in group.items()
            if name == "throttle-time-max"
        ]
        assert max(throttles) > 0
        assert read < 2 * QUOTA_BYTES * seconds
        assert read > 0
    finally:
        consumer.close()


def _alter(
    client: WireClient, entity: dict[str, str | None], ops: Any, validate_only: bool = False
) -> Any:
    m = request_module(49, 1)
    request = m.AlterClientQuotasRequest(
        entries=(
            m.EntryData(
                entity=tuple(m.EntityData(entity_type=k, entity_name=v) for k, v in entity.items()),
                ops=tuple(m.OpData(key=k, value=f64(v or 0.0), remove=v is None) for k, v in ops),
            ),
        ),
        validate_only=validate_only,
    )
    (entry,) = client.request(request).entries
    return entry.error_code, entry.error_message


def _describe(
    client: WireClient, *components: tuple[str, int, str | None], strict: bool = False
) -> Any:
    m = request_module(48, 1)
    return client.request(
        m.DescribeClientQuotasRequest(
            components=tuple(
                m.ComponentData(entity_type=t, match_type=i8(kind), match=match)
                for t, kind, match in components
            ),
            strict=strict,
        )
    )


def _entities(response: Any) -> set[tuple[tuple[str, str | None], ...]]:
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity) for entry in response.entries
    }


def test_alter_and_describe_client_quotas_as_kafka_checks_them(
    quota_broker: TierbrokerCluster,
) -> None:
    user, client_id = unique("u"), unique("c")
    port = int(quota_broker.bootstrap_servers.rsplit(":", 1)[1])
    with WireClient(port) as client:
        invalid = ErrorCode.invalid_request
        assert _alter(client, {"user": user}, [("no_such_quota", 1.0)])[0] == invalid
        assert (
            _alter(client, {"ip": "127.0.0.1"}, [("connection_creation_rate", 1.0)])[0] == invalid
        )
        assert _alter(client, {"user": ""}, [("producer_byte_rate", 1.0)])[0] == invalid
        assert _alter(client, {"user": user}, [("producer_byte_rate", 0.0)])[0] == invalid
        assert (
            _alter(client, {"user": user}, [("producer_byte_rate", 1.0)], True)[0] == ErrorCode.none
        )
        assert _entities(_describe(client, ("user", 0, user))) == set()  # validate_only
        assert _alter(client, {"user": user}, [("request_percentage", 12.5)])[0] == ErrorCode.none
        both = {"user": user, "client-id": client_id}
        assert _alter(client, both, [("consumer_byte_rate", 2048.0)])[0] == ErrorCode.none
        assert _entities(_describe(client, ("user", 0, user))) == {
            (("user", user),),
            (("user", user), ("client-id", client_id)),
        }
        assert _entities(_describe(client, ("user", 0, user), strict=True)) == {(("user", user),)}
        assert _entities(_describe(client, ("user", 0, user), ("client-id", 2, None))) == {
            (("user", user), ("client-id", client_id)),
        }
        (entry,) = _describe(client, ("user", 0, user), strict=True).entries
        assert [(v.key, v.value) for v in entry.values] == [("request_percentage", 12.5)]
        malformed = _describe(client, ("user", 0, None))
        assert malformed.error_code == invalid and malformed.entries is None
        assert _describe(client, ("ip", 2, None)).error_code == ErrorCode.unsupported_version
        assert _alter(client, {"user": user}, [("request_percentage", None)])[0] == ErrorCode.none
        assert _alter(client, both, [("consumer_byte_rate", None)])[0] == ErrorCode.none
        assert _entities(_describe(client, ("user", 0, user))) == set()


def test_a_client_over_its_request_percentage_is_throttled(
    quota_broker: TierbrokerCluster,
) -> None:
    busy, free = unique("busy"), unique("free")
    port = int(quota_broker.bootstrap_servers.rsplit(":", 1)[1])
    metadata = request_module(3, 12)
    request = metadata.MetadataRequest(
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    with WireClient(port) as client:
        # 0.01% of the loop: a tenth of a millisecond of handling per second.
        _alter(client, {"client-id": busy}, [("request_percentage", 0.01)])
        throttle = datetime.timedelta(0)
        for _ in range(50):
            throttle = client.request(request, busy).throttle_time
            if throttle:
                break
        # Throttled, for at most one quota window, as Kafka's request quota.
        assert 0 < throttle.total_seconds() <= 1
        unthrottled = [client.request(request, free).throttle_time for _ in range(50)]
        assert max(unthrottled).total_seconds() == 0


def test_quotas_need_the_cluster_configs_acls(tmp_path: Path) -> None:
    """As Kafka: DESCRIBE_CONFIGS on the cluster to describe quotas, ALTER_CONFIGS to alter
    them; User:ANONYMOUS has neither here."""
    acls = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
    }
    with TierbrokerCluster(tmp_path, broker_config=acls) as cluster:
        port = int(cluster.bootstrap_servers.rsplit(":", 1)[1])
        with WireClient(port) as client:
            refused = _describe(client, ("client-id", 2, None))
            assert refused.error_code == ErrorCode.cluster_authorization_failed
            assert _alter(client, {"client-id": "c"}, [("producer_byte_rate", 1.0)])[0] == (
                ErrorCode.cluster_authorization_failed
            )
