"""The S3 plugin over HTTPS, against moto's server serving a certificate made with
openssl: trusted through `storage.s3.ca.bundle`, it copies and reads segments; signed by
another CA, every call fails at once (not retried) naming the property that fixes it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.certs import session_certs
from tests.integration.moto_server import CREDENTIALS, InstrumentedS3, MotoServer, rsm_configs
from tests.integration.test_s3_rsm import FAST, synthetic_segment
from tierbroker.storage.remote.storage_manager import RemoteStorageError
from tierbroker.testing.clients import produce
from tierbroker.testing.cluster import S3Tier, TierbrokerCluster

CA_BUNDLE_PROPERTY = "rsm.config.storage.s3.ca.bundle"


@pytest.fixture(scope="module")
def https_moto() -> Iterator[MotoServer]:
    broker = session_certs().broker  # SAN IP:127.0.0.1, signed by the session's CA
    server = MotoServer(tls=(broker.chain, broker.key)).start()
    yield server
    server.stop()


@pytest.fixture
async def plugins(https_moto: MotoServer) -> AsyncIterator[list[InstrumentedS3]]:
    made: list[InstrumentedS3] = []
    yield made
    for rsm in made:
        await rsm.close()


def _plugin(made: list[InstrumentedS3], endpoint: str, bucket: str, ca: Path) -> InstrumentedS3:
    rsm = InstrumentedS3()
    rsm.configure(rsm_configs(endpoint, bucket, **FAST, **{"storage.s3.ca.bundle": str(ca)}))
    made.append(rsm)
    return rsm


async def test_the_configured_ca_is_trusted(
    https_moto: MotoServer, plugins: list[InstrumentedS3], tmp_path: Path
) -> None:
    bucket = f"tls-{uuid.uuid4().hex[:12]}"
    https_moto.create_bucket(bucket)
    rsm = _plugin(plugins, https_moto.endpoint, bucket, session_certs().ca.cert)
    assert await rsm.check(5) is True
    data, metadata = synthetic_segment(tmp_path, 100_000)
    await rsm.copy_log_segment_data(metadata, data)
    assert await rsm.fetch_log_segment(metadata, 0) == data.log_segment.read_bytes()


async def test_another_ca_is_refused_at_once_naming_the_property(
    https_moto: MotoServer, plugins: list[InstrumentedS3], tmp_path: Path
) -> None:
    bucket = f"tls-{uuid.uuid4().hex[:12]}"
    https_moto.create_bucket(bucket)
    rsm = _plugin(plugins, https_moto.endpoint, bucket, session_certs().other_ca.cert)
    with pytest.raises(RemoteStorageError) as checked:
        await rsm.check(5)
    assert not checked.value.retriable
    assert "the endpoint's TLS certificate is not trusted" in str(checked.value)
    assert CA_BUNDLE_PROPERTY in str(checked.value)
    data, metadata = synthetic_segment(tmp_path, 100_000)
    with pytest.raises(RemoteStorageError) as copied:
        await rsm.copy_log_segment_data(metadata, data)
    assert not copied.value.retriable
    assert CA_BUNDLE_PROPERTY in str(copied.value)
    assert rsm.faulty.count("put_object") <= 2  # the log and the indexes, each tried once


def test_a_ca_bundle_needs_https_and_a_certificate(tmp_path: Path) -> None:
    rsm = InstrumentedS3()
    ca = str(session_certs().ca.cert)
    with pytest.raises(ValueError, match="plain HTTP"):
        rsm.configure(rsm_configs("http://127.0.0.1:1", "b", **{"storage.s3.ca.bundle": ca}))
    empty = tmp_path / "empty.pem"
    empty.write_text("nothing\n")
    with pytest.raises(ValueError, match="holds no PEM certificate"):
        rsm.configure(
            rsm_configs("https://127.0.0.1:1", "b", **{"storage.s3.ca.bundle": str(empty)})
        )
    with pytest.raises(ValueError, match="cannot read it"):
        rsm.configure(
            rsm_configs("https://127.0.0.1:1", "b", **{"storage.s3.ca.bundle": str(tmp_path / "x")})
        )


def test_a_broker_whose_store_is_untrusted_says_so_and_serves(
    https_moto: MotoServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = f"tls-{uuid.uuid4().hex[:12]}"
    https_moto.create_bucket(bucket)
    tier = S3Tier(
        https_moto.endpoint,
        bucket,
        access_key_id=CREDENTIALS["aws_access_key_id"],
        secret_access_key=CREDENTIALS["aws_secret_access_key"],
    )
    untrusted = {CA_BUNDLE_PROPERTY: str(session_certs().other_ca.cert)}
    with TierbrokerCluster(tmp_path, s3=tier, broker_config=untrusted) as cluster:
        cluster.create_topic("t", 1)
        assert len(produce(cluster.bootstrap_servers, "t", [b"still served"] * 10)) == 10
        assert cluster.metric("RemoteStorageHealthy") == 0
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    refusals = [m for m in logged if "TLS certificate is not trusted" in m]
    assert refusals and all(CA_BUNDLE_PROPERTY in m for m in refusals)
    assert not any("Traceback" in m for m in logged)
