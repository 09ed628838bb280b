"""Secrets in configs: Kafka's PASSWORD-type properties, their per-listener overrides and
the plugins' secrets are recognised, and the start-up summary hides their values."""

from __future__ import annotations

import pytest

from tierbroker.broker.config.broker_config import load_config
from tierbroker.broker.config.security_settings import is_secret
from tierbroker.broker.server.startup_summary import HIDDEN, non_default_settings

SECRET = "s3cr3t-value"


@pytest.mark.parametrize(
    "name",
    [
        "ssl.keystore.password",
        "ssl.key.password",
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
        "ssl.truststore.password",
        "sasl.jaas.config",
        "listener.name.external.ssl.key.password",
        "listener.name.external.scram-sha-512.sasl.jaas.config",
        "rsm.config.storage.aws.secret.access.key",
        "rlmm.config.remote.log.metadata.common.client.ssl.keystore.password",
        "rsm.config.some.plugin.client.secret",
    ],
)
def test_secrets_are_recognised(name: str) -> None:
    assert is_secret(name)


@pytest.mark.parametrize(
    "name",
    [
        "ssl.keystore.location",
        "ssl.truststore.location",
        "sasl.enabled.mechanisms",
        "rsm.config.storage.aws.access.key.id",
        "rsm.config.storage.s3.ca.bundle",
        "rsm.config.encryption.keys.k1.file",  # where the key is, not the key
    ],
)
def test_other_settings_are_not(name: str) -> None:
    assert not is_secret(name)


def test_the_startup_summary_hides_every_secret() -> None:
    config = load_config(
        None,
        [
            "listeners=PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
            f"ssl.keystore.password={SECRET}",
            f"listener.name.ssl.ssl.key.password={SECRET}",
            f"listener.name.ssl.plain.sasl.jaas.config={SECRET}",
            f"rsm.config.storage.aws.secret.access.key={SECRET}",
            "rsm.config.storage.aws.access.key.id=AKIDEXAMPLE",
        ],
    )
    settings = non_default_settings(config)
    assert SECRET not in " ".join(settings)
    assert f"ssl.keystore.password={HIDDEN}" in settings
    assert f"listener.name.ssl.ssl.key.password={HIDDEN}" in settings
    assert f"rsm.config.storage.aws.secret.access.key={HIDDEN}" in settings
    assert "rsm.config.storage.aws.access.key.id=AKIDEXAMPLE" in settings
