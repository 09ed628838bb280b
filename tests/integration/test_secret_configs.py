"""DescribeConfigs of a broker configured with secrets: as Kafka answers, each is
sensitive and its value null (in its synonyms too), while the other properties given
as they are read (security, the plugins') are shown."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tierbroker.testing import cluster_fixture
from tierbroker.testing.cluster import TierbrokerCluster

SECRET = "s3cr3t-value"
secret_broker = cluster_fixture(
    "module",
    broker_config={
        "ssl.keystore.password": SECRET,
        "listener.name.plaintext.ssl.key.password": SECRET,
        "rsm.config.storage.aws.secret.access.key": SECRET,
        "rsm.config.storage.aws.access.key.id": "AKIDEXAMPLE",
    },
)


def test_secrets_are_described_as_sensitive_without_their_value(
    secret_broker: TierbrokerCluster,
) -> None:
    admin = AdminClient({"bootstrap.servers": secret_broker.bootstrap_servers})
    resource = ConfigResource(ResourceType.BROKER, "0")
    described = admin.describe_configs([resource])[resource].result(30)
    for name in (
        "ssl.keystore.password",
        "listener.name.plaintext.ssl.key.password",
        "rsm.config.storage.aws.secret.access.key",
    ):
        entry = described[name]
        assert entry.is_sensitive, name
        assert entry.value is None, name
        assert all(s.value is None for s in entry.synonyms.values()), name
    access_key = described["rsm.config.storage.aws.access.key.id"]
    assert not access_key.is_sensitive and access_key.value == "AKIDEXAMPLE"
    assert not described["broker.id"].is_sensitive
    assert all(SECRET != entry.value for entry in described.values())
