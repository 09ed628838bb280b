"""S3RemoteStorageManager against moto's standalone server: multipart uploads and their abort,
orphan clean-up, retries with back-off, timeouts, outages, cancellation, configuration.

Faults are injected by `FaultyClient` around the plugin's real S3 clients (the
calls still go over HTTP to moto), or by stopping moto, or by a socket that
never answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from botocore.exceptions import EndpointConnectionError

from tests.integration.moto_server import (
    FaultyClient,
    InstrumentedS3,
    MotoServer,
    client_error,
    moto,  # noqa: F401 (a fixture)
    moto_endpoint,  # noqa: F401 (a fixture)
    rsm_configs,
)
from tierbroker.storage.remote import s3
from tierbroker.storage.remote.key_layout import (
    INDEXES_SUFFIX,
    LOG_SUFFIX,
    MANIFEST_SUFFIX,
    ObjectKeyLayout,
)
from tierbroker.storage.remote.s3 import MIB, S3RemoteStorageManager, backoff_s
from tierbroker.storage.remote.s3_payload import OPERATIONS, PREHASHED_S3V4, HashedBody
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    TopicIdPartition,
)
from tierbroker.storage.remote.storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteResourceNotFoundError,
    RemoteStorageError,
)
from tierbroker.storage.topic_partition import TopicPartition

TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("s3", 0))
LAYOUT = ObjectKeyLayout(cluster="c1")
FAST = {
    "cluster.id": "c1",
    "storage.s3.multipart.upload.part.size": str(5 * MIB),  # moto's (and S3's) minimum
    "storage.s3.retry.max.attempts": "3",
    "storage.s3.retry.backoff.ms": "10",
    "storage.s3.retry.backoff.max.ms": "50",
    "storage.s3.api.call.timeout.ms": "5000",
}


class Maker(Protocol):
    def __call__(self, endpoint: str | None = None, **extra: str) -> Awaitable[InstrumentedS3]: ...


@pytest.fixture
async def make_rsm(moto_endpoint: str) -> AsyncIterator[Maker]:  # noqa: F811
    """Plugins on a fresh bucket of the module's moto server (or on `endpoint`)."""
    bucket = f"s3-{uuid.uuid4().hex[:12]}"
    plugins: list[InstrumentedS3] = []

    async def make(endpoint: str | None = None, **extra: str) -> InstrumentedS3:
        plugin = InstrumentedS3()
        settings = {**FAST, **{k.replace("_", "."): v for k, v in extra.items()}}
        plugin.configure(rsm_configs(endpoint or moto_endpoint, bucket, **settings))
        plugins.append(plugin)
        if endpoint is None and len(plugins) == 1:
            await (await plugin.raw()).create_bucket(Bucket=bucket)
        return plugin

    yield make
    for plugin in plugins:
        await plugin.close()


def synthetic_segment(
    directory: Path, size: int
) -> tuple[LogSegmentData, RemoteLogSegmentMetadata]:
    """Files standing in for a segment (their content does not matter to the plugin)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for suffix, length in (("log", size), ("index", 4096), ("timeindex", 4096)):
        files[suffix] = directory / f"00000000000000000000.{suffix}"
        files[suffix].write_bytes(uuid.uuid4().bytes * (length // 16))
    data = LogSegmentData(files["log"], files["index"], files["timeindex"], None, None, b"0\n0\n")
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(TIP),
        start_offset=0,
        end_offset=99,
        max_timestamp_ms=0,
        broker_id=0,
        event_timestamp_ms=0,
        segment_size_bytes=size,
        segment_leader_epochs=((0, 0),),
    )
    return data, metadata


async def stored(plugin: InstrumentedS3) -> dict[str, Any]:
    """Every object of the bucket: key -> its listing entry."""
    client = await plugin.raw()
    response = await client.list_objects_v2(Bucket=plugin.bucket)
    return {o["Key"]: o for o in response.get("Contents", [])}


async def open_uploads(plugin: InstrumentedS3) -> list[Any]:
    response = await (await plugin.raw()).list_multipart_uploads(Bucket=plugin.bucket)
    uploads: list[Any] = response.get("Uploads", [])
    return uploads


def faulty(plugin: InstrumentedS3) -> FaultyClient:
    return plugin.faulty


async def hooked(
    plugin: InstrumentedS3, hook: Callable[[str, dict[str, Any]], Awaitable[None]]
) -> None:
    """Install `hook` on the plugin's (wrapped) clients."""
    faulty(plugin).hooks.append(hook)


# Multipart uploads -----------------------------------------------------------------


async def test_multipart_upload_above_the_part_size(make_rsm: Maker, tmp_path: Path) -> None:
    data, metadata = synthetic_segment(tmp_path, 12 * MIB)
    content = data.log_segment.read_bytes()
    rsm = await make_rsm()
    await rsm.copy_log_segment_data(metadata, data)

    key = LAYOUT.segment_key(metadata, LOG_SUFFIX)
    objects = await stored(rsm)
    assert objects[key]["Size"] == len(content)
    assert objects[key]["ETag"].strip('"').endswith("-3")  # 5 + 5 + 2 MiB: three parts
    calls = faulty(rsm)
    assert calls.count("create_multipart_upload") == 1 and calls.count("upload_part") == 3
    assert ("put_object", key) not in calls.calls
    indexes = LAYOUT.segment_key(metadata, INDEXES_SUFFIX)
    assert ("put_object", indexes) in calls.calls  # small: one PutObject
    assert await open_uploads(rsm) == []
    assert await rsm.fetch_log_segment(metadata, 0) == content
    boundary = 5 * MIB  # a range across the first part boundary
    part_range = await rsm.fetch_log_segment(metadata, boundary - 10, boundary + 9)
    assert part_range == content[boundary - 10 : boundary + 10]


async def test_uploads_are_signed_with_the_hash_taken_where_they_were_read(
    make_rsm: Maker, tmp_path: Path
) -> None:
    large, large_metadata = synthetic_segment(tmp_path / "large", 7 * MIB)  # two parts
    small, small_metadata = synthetic_segment(tmp_path / "small", 2 * MIB)  # one PutObject
    rsm = await make_rsm()
    signers: list[tuple[str, str]] = []
    sent: list[Any] = []
    events = (await rsm.raw()).meta.events
    events.register(
        "before-sign.s3",
        lambda operation_name, signature_version, **_: signers.append(
            (operation_name, signature_version)
        ),
    )
    events.register("before-send.s3", lambda request, **_: sent.append(request))
    await rsm.copy_log_segment_data(large_metadata, large)
    await rsm.copy_log_segment_data(small_metadata, small)

    uploads = {op: {s for o, s in signers if o == op} for op in OPERATIONS}
    assert uploads == {"PutObject": {PREHASHED_S3V4}, "UploadPart": {PREHASHED_S3V4}}
    logs = [r for r in sent if isinstance(r.body, HashedBody)]
    assert sorted(len(r.body.getvalue()) for r in logs) == [2 * MIB, 2 * MIB, 5 * MIB]
    for request in logs:  # what S3 checks: the hash of the bytes sent
        digest = hashlib.sha256(request.body.getvalue()).hexdigest()
        assert request.headers["X-Amz-Content-SHA256"] == digest.encode()
    assert await rsm.fetch_log_segment(large_metadata, 0) == large.log_segment.read_bytes()


async def test_gets_run_in_the_reader_threads_not_on_the_event_loop(
    make_rsm: Maker, tmp_path: Path
) -> None:
    data, metadata = synthetic_segment(tmp_path, 10_000)
    rsm = await make_rsm()
    await rsm.copy_log_segment_data(metadata, data)
    getters: list[str] = []
    (await rsm.raw_reader()).meta.events.register(
        "before-send.s3.GetObject", lambda **_: getters.append(threading.current_thread().name)
    )
    assert await rsm.fetch_log_segment(metadata, 10, 99) == data.log_segment.read_bytes()[10:100]
    assert await rsm.fetch_index(metadata, IndexType.OFFSET) == data.offset_index.read_bytes()
    assert len(getters) == 2 and all(name.startswith("s3-reader") for name in getters), getters


async def test_a_file_up_to_the_part_size_is_one_put(make_rsm: Maker, tmp_path: Path) -> None:
    data, metadata = synthetic_segment(tmp_path, 5 * MIB)
    rsm = await make_rsm()
    await rsm.copy_log_segment_data(metadata, data)
    key = LAYOUT.segment_key(metadata, LOG_SUFFIX)
    assert ("put_object", key) in faulty(rsm).completed
    assert faulty(rsm).count("create_multipart_upload") == 0
    assert "-" not in (await stored(rsm))[key]["ETag"]


@pytest.mark.parametrize("fault", ["source shrinks", "part rejected", "complete fails"])
async def test_a_failed_multipart_upload_is_aborted_and_leaves_no_objects(
    make_rsm: Maker, tmp_path: Path, fault: str
) -> None:
    data, metadata = synthetic_segment(tmp_path, 6 * MIB)  # two parts: 5 MiB and 1 MiB
    rsm = await make_rsm()

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        if method == "upload_part" and kwargs["PartNumber"] == 1 and fault == "source shrinks":
            data.log_segment.write_bytes(b"x" * MIB)  # the second part cannot be read
        if method == "upload_part" and kwargs["PartNumber"] == 2 and fault == "part rejected":
            raise client_error("AccessDenied", 403, "UploadPart")
        if method == "complete_multipart_upload" and fault == "complete fails":
            raise client_error("InternalError", 500, "CompleteMultipartUpload")

    await hooked(rsm, hook)
    with pytest.raises(RemoteStorageError) as failure:
        await rsm.copy_log_segment_data(metadata, data)

    assert failure.value.retriable is (fault != "part rejected")  # a 403 will not pass
    calls = faulty(rsm)
    assert calls.count("abort_multipart_upload") == 1
    assert await open_uploads(rsm) == []  # nothing dangling
    assert await stored(rsm) == {}  # and no object of the segment
    expected_parts = {"source shrinks": 1, "part rejected": 2, "complete fails": 2}[fault]
    assert calls.count("upload_part") == expected_parts
    if fault == "complete fails":
        assert calls.count("complete_multipart_upload") == 3  # retried: a 500


async def test_an_upload_whose_creation_answer_was_lost_is_still_aborted(
    make_rsm: Maker, tmp_path: Path
) -> None:
    data, metadata = synthetic_segment(tmp_path, 6 * MIB)
    rsm = await make_rsm(storage_s3_retry_max_attempts="1")
    raw = await rsm.raw()

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        if method == "create_multipart_upload":
            await raw.create_multipart_upload(**kwargs)  # S3 did it; the answer never came
            raise EndpointConnectionError(endpoint_url="lost")

    await hooked(rsm, hook)
    with pytest.raises(RemoteStorageError):
        await rsm.copy_log_segment_data(metadata, data)
    assert await open_uploads(rsm) == []  # found by listing and aborted
    assert await stored(rsm) == {}


# Orphan clean-up -------------------------------------------------------------------


async def test_a_failed_manifest_put_removes_the_uploaded_objects(
    make_rsm: Maker, tmp_path: Path
) -> None:
    data, metadata = synthetic_segment(tmp_path, 100_000)
    rsm = await make_rsm()

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        if method == "put_object" and kwargs["Key"].endswith(MANIFEST_SUFFIX):
            raise client_error("AccessDenied", 403)

    await hooked(rsm, hook)
    with pytest.raises(RemoteStorageError) as failure:
        await rsm.copy_log_segment_data(metadata, data)
    assert not failure.value.retriable
    uploaded = [k for m, k in faulty(rsm).completed if m == "put_object"]
    assert len(uploaded) == 2  # the log and the indexes went up, not the manifest
    assert await stored(rsm) == {}  # and was deleted again
    manifest = LAYOUT.segment_key(metadata, MANIFEST_SUFFIX)
    deletes = [(m, k) for m, k in faulty(rsm).calls if m.startswith("delete")]
    assert deletes == [("delete_object", manifest), ("delete_objects", "")]  # the manifest first


async def test_delete_removes_the_manifest_first_then_the_rest_in_one_call(
    make_rsm: Maker, tmp_path: Path
) -> None:
    data, metadata = synthetic_segment(tmp_path, 10_000)
    rsm = await make_rsm()
    await rsm.copy_log_segment_data(metadata, data)
    batches: list[set[str]] = []

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        if method == "delete_object":
            assert len(await stored(rsm)) == 3  # nothing gone yet
            batches.append({kwargs["Key"]})
        elif method == "delete_objects":
            assert len(await stored(rsm)) == 2  # the manifest is gone
            batches.append({o["Key"] for o in kwargs["Delete"]["Objects"]})

    await hooked(rsm, hook)
    await rsm.delete_log_segment_data(metadata)
    *rest, manifest = LAYOUT.all_keys(metadata)
    assert batches == [{manifest}, set(rest)]  # every possible object, present or not
    assert await stored(rsm) == {}


# Retries, back-off, timeouts --------------------------------------------------------


RETRIABLE_FAULTS = {
    "SlowDown 503": client_error("SlowDown", 503, "GetObject"),
    "ServiceUnavailable 503": client_error("ServiceUnavailable", 503, "GetObject"),
    "InternalError 500": client_error("InternalError", 500, "GetObject"),
    "429": client_error("TooManyRequests", 429, "GetObject"),
    "ThrottlingException 400": client_error("ThrottlingException", 400, "GetObject"),
    "RequestTimeout 400": client_error("RequestTimeout", 400, "GetObject"),
    "connection refused": EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    "reset": ConnectionResetError("reset by peer"),
}


@pytest.mark.parametrize("fault", sorted(RETRIABLE_FAULTS))
async def test_retriable_errors_are_retried_until_the_call_passes(
    make_rsm: Maker, tmp_path: Path, fault: str
) -> None:
    data, metadata = synthetic_segment(tmp_path, 10_000)
    rsm = await make_rsm()
    await rsm.copy_log_segment_data(metadata, data)
    failures = [RETRIABLE_FAULTS[fault]] * 2  # fails twice; the third of 3 attempts passes

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        if method == "get_object" and failures:
            raise failures.pop()

    await hooked(rsm, hook)
    assert await rsm.fetch_index(metadata, IndexType.OFFSET) == data.offset_index.read_bytes()
    assert faulty(rsm).count("get_object") == 3


async def test_retriable_errors_give_up_after_max_attempts(make_rsm: Maker) -> None:
    rsm = await make_rsm(storage_s3_retry_max_attempts="4")
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(TIP),
        start_offset=0,
        end_offset=0,
        max_timestamp_ms=0,
        broker_id=0,
        event_timestamp_ms=0,
        segment_size_bytes=0,
        segment_leader_epochs=((0, 0),),
    )

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        raise client_error("SlowDown", 503, "GetObject")

    await hooked(rsm, hook)
    with pytest.raises(RemoteStorageError) as failure:
        await rsm.fetch_log_segment(metadata, 0)
    assert failure.value.retriable and "SlowDown" in str(failure.value)
    assert faulty(rsm).count("get_object") == 4


@pytest.mark.parametrize(
    ("code", "status"), [("AccessDenied", 403), ("NoSuchBucket", 404), ("InvalidArgument", 400)]
)
async def test_other_errors_fail_at_once_and_not_retriable(
    make_rsm: Maker, tmp_path: Path, code: str, status: int
) -> None:
    data, metadata = synthetic_segment(tmp_path, 10_000)
    rsm = await make_rsm()
    await rsm.copy_log_segment_data(metadata, data)

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        raise client_error(code, status, "GetObject")

    await hooked(rsm, hook)
    with pytest.raises(RemoteStorageError) as failure:
        await rsm.fetch_index(metadata, IndexType.OFFSET)
    assert not failure.value.retriable
    assert not isinstance(failure.value, RemoteResourceNotFoundError)  # a bucket is not a key
    assert faulty(rsm).count("get_object") == 1


async def test_one_get_serves_every_index_of_a_recent_segment(
    make_rsm: Maker, tmp_path: Path
) -> None:
    rsm = await make_rsm()
    segments = [
        synthetic_segment(tmp_path / str(i), 10_000) for i in range(s3.INDEXES_OBJECTS_KEPT + 1)
    ]
    for data, metadata in segments:
        await rsm.copy_log_segment_data(metadata, data)
    (data, first), (other_data, other) = segments[0], segments[1]

    def gets(metadata: RemoteLogSegmentMetadata) -> int:
        return faulty(rsm).calls.count(("get_object", LAYOUT.segment_key(metadata, INDEXES_SUFFIX)))

    offsets, times = await asyncio.gather(
        rsm.fetch_index(first, IndexType.OFFSET), rsm.fetch_index(first, IndexType.TIMESTAMP)
    )
    assert (offsets, times) == (data.offset_index.read_bytes(), data.time_index.read_bytes())
    assert await rsm.fetch_index(first, IndexType.OFFSET) == offsets
    assert gets(first) == 1
    # Only the last few segments' objects are kept.
    for _, metadata in segments[1:]:
        await rsm.fetch_index(metadata, IndexType.OFFSET)
    await rsm.fetch_index(first, IndexType.OFFSET)
    assert gets(first) == 2

    # A failed GET is not kept: the next fetch tries again.
    failures = [client_error("AccessDenied", 403, "GetObject")]

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        if method == "get_object" and failures:
            raise failures.pop()

    await hooked(rsm, hook)
    with pytest.raises(RemoteStorageError, match="AccessDenied"):
        await rsm.fetch_index(other, IndexType.OFFSET)  # evicted above
    assert await rsm.fetch_index(other, IndexType.OFFSET) == other_data.offset_index.read_bytes()
    assert gets(other) == 3
    # A deleted segment's indexes are not answered from memory.
    await rsm.delete_log_segment_data(first)
    with pytest.raises(RemoteResourceNotFoundError):
        await rsm.fetch_index(first, IndexType.TIMESTAMP)


def test_backoff_is_exponential_with_full_jitter() -> None:
    for attempt in range(1, 10):
        cap = min(5.0, 0.1 * 2 ** (attempt - 1))
        samples = [backoff_s(attempt, 0.1, 5.0) for _ in range(300)]
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > 0.8 * cap and min(samples) < 0.2 * cap  # spread over [0, cap]


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


async def test_a_call_that_hangs_fails_after_the_api_timeout(
    make_rsm: Maker, silent_endpoint: str, tmp_path: Path
) -> None:
    data, metadata = synthetic_segment(tmp_path, 10_000)
    rsm = await make_rsm(
        silent_endpoint,
        storage_s3_api_call_timeout_ms="300",
        storage_s3_retry_max_attempts="2",
    )
    # The test's own guard (10 s) would raise TimeoutError, not RemoteStorageError.
    with pytest.raises(RemoteStorageError) as failure:
        await asyncio.wait_for(rsm.fetch_log_segment(metadata, 0, 10), 10)
    assert failure.value.retriable
    assert faulty(rsm).count("get_object") == 2  # each attempt cut, then given up

    # A PUT is the case that matters: aiobotocore's read timeout does not bound it.
    with pytest.raises(RemoteStorageError):  # the copy's clean-up is bounded alike
        await asyncio.wait_for(rsm.copy_log_segment_data(metadata, data), 10)


async def test_a_slow_attempt_is_cut_and_the_next_one_passes(
    make_rsm: Maker, tmp_path: Path
) -> None:
    data, metadata = synthetic_segment(tmp_path, 10_000)
    rsm = await make_rsm(storage_s3_api_call_timeout_ms="300")
    await rsm.copy_log_segment_data(metadata, data)
    slow = [True]

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        if method == "get_object" and slow:
            slow.pop()
            await asyncio.sleep(10)  # the first attempt hangs

    await hooked(rsm, hook)
    # The hung attempt outlasts the guard: passing means it was cut.
    content = await asyncio.wait_for(rsm.fetch_log_segment(metadata, 0), 10)
    assert content == data.log_segment.read_bytes()
    assert faulty(rsm).count("get_object") == 2


# Outages ---------------------------------------------------------------------------


async def test_moto_stops_mid_copy_and_is_back_within_the_attempts(
    moto: MotoServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    data, metadata = synthetic_segment(tmp_path, 100_000)
    rsm = InstrumentedS3()
    rsm.configure(rsm_configs(moto.endpoint, "outage", **FAST))
    await (await rsm.raw()).create_bucket(Bucket="outage")
    loop = asyncio.get_running_loop()
    puts: list[str] = []
    restarted: list[asyncio.Task[None]] = []
    ready = asyncio.Event()

    async def back_up() -> None:  # back, but empty
        await loop.run_in_executor(None, moto.start)
        await loop.run_in_executor(None, moto.create_bucket, "outage")
        ready.set()

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        if method != "put_object":
            return
        puts.append(kwargs["Key"])
        if len(puts) == 1:
            await loop.run_in_executor(None, moto.stop)  # this attempt meets a closed port
            restarted.append(loop.create_task(back_up()))
        else:  # the copy's other PUTs (it uploads concurrently) and the retry wait for it
            await ready.wait()

    try:
        await hooked(rsm, hook)
        await rsm.copy_log_segment_data(metadata, data)
        await restarted[0]
        assert puts.count(puts[0]) >= 2  # the PUT that met the closed port was tried again
        assert await rsm.fetch_log_segment(metadata, 0) == data.log_segment.read_bytes()
    finally:
        await rsm.close()


async def test_moto_down_fails_retriably_and_restart_recovers(
    moto: MotoServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    data, metadata = synthetic_segment(tmp_path, 10_000)
    rsm = S3RemoteStorageManager()
    rsm.configure(rsm_configs(moto.endpoint, "restart", **FAST))
    loop = asyncio.get_running_loop()
    try:
        await (await rsm.client()).create_bucket(Bucket="restart")
        await rsm.copy_log_segment_data(metadata, data)  # pooled connections now open
        await loop.run_in_executor(None, moto.restart)
        await loop.run_in_executor(None, moto.create_bucket, "restart")
        await rsm.copy_log_segment_data(metadata, data)  # the same client, after a restart
        assert await rsm.fetch_log_segment(metadata, 0) == data.log_segment.read_bytes()

        await loop.run_in_executor(None, moto.stop)
        with pytest.raises(RemoteStorageError) as failure:  # the guard raises TimeoutError
            await asyncio.wait_for(rsm.fetch_log_segment(metadata, 0), 10)
        assert failure.value.retriable
    finally:
        await rsm.close()


# Cancellation ----------------------------------------------------------------------


async def test_a_cancelled_copy_is_cleaned_up_in_the_background(
    make_rsm: Maker, tmp_path: Path
) -> None:
    data, metadata = synthetic_segment(tmp_path, 6 * MIB)
    rsm = await make_rsm()
    second_part = asyncio.Event()

    async def hook(method: str, kwargs: dict[str, Any]) -> None:
        if method == "upload_part" and kwargs["PartNumber"] == 2:
            second_part.set()
            await asyncio.sleep(30)

    await hooked(rsm, hook)
    copy = asyncio.create_task(rsm.copy_log_segment_data(metadata, data))
    await asyncio.wait_for(second_part.wait(), 10)
    copy.cancel()
    with pytest.raises(asyncio.CancelledError):
        await copy
    await rsm.close()  # waits for the clean-up
    checker = await make_rsm()
    assert await open_uploads(checker) == []
    assert await stored(checker) == {}


async def test_a_copy_cancelled_while_its_log_opens_closes_the_file(
    make_rsm: Maker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, metadata = synthetic_segment(tmp_path, 10_000)
    rsm = await make_rsm()
    release, opened = threading.Event(), []
    open_file = s3._open

    def slow_open(path: Path) -> tuple[int, int]:  # in the executor's thread
        release.wait(10)
        fd, size = open_file(path)
        opened.append(fd)
        return fd, size

    monkeypatch.setattr(s3, "_open", slow_open)
    copy = asyncio.create_task(rsm.copy_log_segment_data(metadata, data))
    await asyncio.sleep(0.2)  # the copy waits on the open
    copy.cancel()
    with pytest.raises(asyncio.CancelledError):
        await copy
    release.set()
    await rsm.close()  # waits for the clean-up; the open finished meanwhile
    for _ in range(100):  # the close runs on the loop once the open is done
        if opened:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)
    [fd] = opened
    try:
        still = os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        still = None  # closed, and the number not reused
    assert still != str(data.log_segment), "the log file was left open"


# Configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"storage.s3.bucket.name": ""}, "storage.s3.bucket.name"),
        ({"storage.s3.multipart.upload.part.size": str(MIB)}, "part.size"),
        ({"storage.s3.path.style.access.enabled": "yes"}, "true or false"),
        ({"storage.aws.secret.access.key": ""}, "go together"),
        ({"storage.s3.api.call.timeout.ms": "soon"}, "not an integer"),
        ({"key.prefix.entropy.bits": "33"}, "entropy"),
    ],
)
def test_bad_settings_are_rejected(override: dict[str, str], message: str) -> None:
    plugin = S3RemoteStorageManager()
    with pytest.raises(ValueError, match=message):
        plugin.configure(rsm_configs("http://127.0.0.1:1", "b") | override)


def test_settings_and_defaults() -> None:
    plugin = S3RemoteStorageManager()
    plugin.configure(
        rsm_configs("http://127.0.0.1:1", "b", **{"key.prefix": "p/", "cluster.id": "c9"})
    )  # no event loop needed: the client is made on first use
    assert (plugin.bucket, plugin.part_size, plugin.call_timeout_s) == ("b", 8 * MIB, 30.0)
    assert (plugin.max_attempts, plugin.backoff_s, plugin.backoff_max_s) == (5, 0.1, 5.0)
    assert plugin.layout == ObjectKeyLayout(prefix="p/", entropy_bits=0, cluster="c9")


@pytest.mark.parametrize(
    ("endpoint", "verify"),
    [("http://127.0.0.1:1", False), ("https://s3.example", None), ("", None)],
)
def test_certificates_are_verified_by_botocore_except_over_plain_http(
    endpoint: str, verify: bool | None
) -> None:
    """HTTPS leaves `verify` to botocore, so AWS_CA_BUNDLE and ca_bundle still apply."""
    plugin = S3RemoteStorageManager()
    plugin.configure(rsm_configs(endpoint, "b"))
    assert plugin._client_args.get("verify") == verify
