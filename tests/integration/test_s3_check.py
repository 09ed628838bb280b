"""The S3 plugin's check (one HeadBucket) and its configuration errors, against moto's
standalone server: each names the bucket and the broker property that fixes it, and a
configuration mistake is not retried."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.integration.broker_process import free_port
from tests.integration.moto_server import (
    InstrumentedS3,
    client_error,
    moto_endpoint,  # noqa: F401 (a fixture)
    rsm_configs,
)
from tests.integration.test_s3_rsm import FAST, synthetic_segment
from tierbroker.storage.remote.storage_manager import RemoteStorageError

BUCKET_PROPERTY = "rsm.config.storage.s3.bucket.name"
ENDPOINT_PROPERTY = "rsm.config.storage.s3.endpoint.url"


class Maker(Protocol):
    def __call__(self, bucket: str, endpoint: str | None = None) -> InstrumentedS3: ...


@pytest.fixture
async def plugin(moto_endpoint: str) -> AsyncIterator[Maker]:  # noqa: F811
    """Plugins on a bucket of the module's moto server (not created), or on `endpoint`."""
    plugins: list[InstrumentedS3] = []

    def make(bucket: str, endpoint: str | None = None) -> InstrumentedS3:
        rsm = InstrumentedS3()
        rsm.configure(rsm_configs(endpoint or moto_endpoint, bucket, **FAST))
        plugins.append(rsm)
        return rsm

    yield make
    for rsm in plugins:
        await rsm.close()


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def bucket_name() -> str:
    return f"check-{uuid.uuid4().hex[:12]}"


async def test_a_bucket_that_exists_passes(plugin: Maker) -> None:
    rsm = plugin(bucket_name())
    await (await rsm.raw()).create_bucket(Bucket=rsm.bucket)
    assert await rsm.check(5) is True
    assert rsm.faulty.calls == [("head_bucket", "")]


async def test_a_missing_bucket_names_the_bucket_and_the_property(
    plugin: Maker,
    moto_endpoint: str,  # noqa: F811
) -> None:
    rsm = plugin(bucket_name())
    with pytest.raises(RemoteStorageError) as failure:
        await rsm.check(5)
    assert str(failure.value) == (
        f"S3 bucket '{rsm.bucket}' at {moto_endpoint} does not exist: "
        f"create it, or fix {BUCKET_PROPERTY}"
    )
    assert not failure.value.retriable


async def test_a_copy_to_a_missing_bucket_fails_at_once_naming_the_property(
    plugin: Maker, tmp_path: Path
) -> None:
    rsm = plugin(bucket_name())
    data, metadata = synthetic_segment(tmp_path, 10_000)
    with pytest.raises(RemoteStorageError) as failure:
        await rsm.copy_log_segment_data(metadata, data)
    assert not failure.value.retriable
    assert f": NoSuchBucket: S3 bucket '{rsm.bucket}'" in str(failure.value)
    assert str(failure.value).endswith(f"does not exist: create it, or fix {BUCKET_PROPERTY}")
    assert rsm.faulty.count("put_object") <= 2  # the log and the indexes, each tried once


@pytest.mark.parametrize(
    ("code", "status", "property_name"),
    [
        ("403", 403, "rsm.config.storage.aws.access.key.id"),
        ("InvalidAccessKeyId", 403, "rsm.config.storage.aws.access.key.id"),
        ("SignatureDoesNotMatch", 403, "rsm.config.storage.aws.secret.access.key"),
        ("301", 301, "rsm.config.storage.s3.region"),
    ],
)
async def test_refused_credentials_and_a_wrong_region_name_their_property(
    plugin: Maker, code: str, status: int, property_name: str
) -> None:
    rsm = plugin(bucket_name())

    async def refuse(method: str, kwargs: dict[str, Any]) -> None:
        raise client_error(code, status, method)

    rsm.faulty.hooks.append(refuse)
    with pytest.raises(RemoteStorageError) as failure:
        await rsm.check(5)
    assert f"S3 bucket '{rsm.bucket}'" in str(failure.value)
    assert property_name in str(failure.value)
    assert not failure.value.retriable


async def test_an_endpoint_that_does_not_answer_is_given_up_in_time(
    plugin: Maker, silent_endpoint: str
) -> None:
    rsm = plugin(bucket_name(), silent_endpoint)
    with pytest.raises(RemoteStorageError) as failure:
        await asyncio.wait_for(rsm.check(0.5), 10)  # the guard would raise TimeoutError
    assert str(failure.value) == (
        f"S3 bucket '{rsm.bucket}' at {silent_endpoint}: no answer within 0.5s: "
        f"check {ENDPOINT_PROPERTY}"
    )
    assert failure.value.retriable


async def test_an_endpoint_that_refuses_connections_names_the_property(plugin: Maker) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    rsm = plugin(bucket_name(), endpoint)
    with pytest.raises(RemoteStorageError) as failure:
        await rsm.check(5)
    message = str(failure.value)
    assert message.startswith(f"S3 bucket '{rsm.bucket}' at {endpoint}: cannot reach it")
    assert message.endswith(f"check {ENDPOINT_PROPERTY}") and failure.value.retriable
