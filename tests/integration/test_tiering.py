"""Tiered storage acceptance (KIP-405), once on the LocalFs tier and once on S3 (moto's server).

One broker per tier (module-scoped, started through the CLI); one topic with
remote.storage.enable=true, 1 MiB segments and local.retention.bytes 2 MiB; confluent-kafka
produces TOTAL_MIB of keyed 1 KiB records whose key, value and timestamp are functions of
their offset. The tests then run in this order on that broker (each states what it needs):

  tiering settles -> remote objects match the status -> confluent, kcat and aiokafka read
  everything from offset 0 -> ListOffsets -2/-1/-4/-5/-6 -> ListOffsets by timestamps in
  the remote tier -> kill -9 and restart: same state, same data, nothing uploaded again ->
  lower retention.bytes: the oldest remote segments go, the earliest offset moves ->
  DeleteTopics: the remote objects go.

TOTAL_MIB (env TIERING_TOTAL_MIB) is the data size; 50 is the acceptance size.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)

from tests.integration.broker_process import BrokerProcess
from tests.integration.tiering_helpers import (
    EARLIEST,
    EARLIEST_LOCAL,
    EARLIEST_PENDING_UPLOAD,
    LATEST,
    LATEST_TIERED,
    MIB,
    OFFSET_OUT_OF_RANGE,
    LocalFsTier,
    S3Tier,
    Tier,
    check_records,
    decode,
    fetch,
    key_of,
    list_offsets,
    metric,
    metrics,
    produce,
    read_aiokafka,
    read_confluent,
    read_kcat,
    segment_start,
    status,
    timestamp_of,
    value_of,
)
from tests.integration.waiting import wait_for

TOTAL_MIB = int(os.environ.get("TIERING_TOTAL_MIB", "50"))
VALUE_SIZE = 1024
MESSAGES = TOTAL_MIB * MIB // VALUE_SIZE
SEGMENT_BYTES = 1 * MIB
LOCAL_RETENTION_BYTES = 2 * MIB
TOPIC = "tiered"
TASK_INTERVAL_MS = 500
FAST = {
    "remote.log.manager.task.interval.ms": str(TASK_INTERVAL_MS),
    "log.retention.check.interval.ms": "500",
    "remote.fetch.max.wait.ms": "500",
    # Snapshot the remote metadata often, so restarts load a snapshot and replay what follows.
    "rlmm.config.snapshot.interval.ms": "1000",
}
# Local tail: local.retention.bytes deletes while the excess is at least a segment, so at most
# 2 MiB + one rolled segment + the active one stay; a little slack for batch boundaries.
MAX_LOCAL_BYTES = LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES + 64 * 1024


@dataclass
class Env:
    tier: Tier
    data_dir: Path
    broker: BrokerProcess
    messages: int  # records in the topic (more are produced after the restart)
    settled: dict[str, Any]  # the tier status once tiering caught up
    timings: dict[str, float]

    def status(self) -> dict[str, Any]:
        return status(self.broker, TOPIC)


def settled(broker: BrokerProcess, messages: int) -> dict[str, Any] | None:
    """The status once everything is tiered and local retention has nothing left to do:
    unchanged across two retention checks."""
    s = status(broker, TOPIC)
    done = (
        s
        and s["log_end_offset"] == messages
        and s["copy_lag_segments"] == 0
        and s["copy_lag_bytes"] == 0
        and s["local_bytes"] <= MAX_LOCAL_BYTES
    )
    if not done:
        return None
    time.sleep(2 * int(FAST["log.retention.check.interval.ms"]) / 1000)
    return s if status(broker, TOPIC) == s else None


@pytest.fixture(scope="module", params=["localfs", "s3"])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    data_dir = tmp_path_factory.mktemp(request.param)
    tier: Tier = LocalFsTier(data_dir) if request.param == "localfs" else S3Tier()
    broker = BrokerProcess(data_dir, {**FAST, **tier.overrides()})
    e = Env(tier, data_dir, broker, 0, {}, {})
    try:
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {
            "remote.storage.enable": "true",
            "segment.bytes": str(SEGMENT_BYTES),
            "local.retention.bytes": str(LOCAL_RETENTION_BYTES),
        }
        admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(15)
        started = time.monotonic()
        report = produce(broker.bootstrap, TOPIC, 0, MESSAGES, VALUE_SIZE)
        e.timings["produce_s"] = report.seconds
        e.messages = MESSAGES
        e.settled = wait_for(
            lambda: settled(e.broker, MESSAGES),
            "copy lag 0 and only the tail kept locally",
            timeout_s=120,
            show=e.status,
        )
        e.timings["produce_to_settled_s"] = time.monotonic() - started
        yield e
    finally:
        e.broker.kill()
        tier.stop()
        print(f"\n[{request.param}] timings: {e.timings}")
    log = e.broker.log()
    assert "Traceback" not in log, log[-5000:]


# 1. Tiering settles -------------------------------------------------------------------------


def test_copy_lag_reaches_zero_and_only_the_tail_stays_local(env: Env) -> None:
    s = env.settled
    assert s["log_start_offset"] == 0
    assert s["remote_log_start_offset"] == 0
    assert s["local_log_start_offset"] > 0
    assert s["local_bytes"] <= MAX_LOCAL_BYTES, s
    # Everything below the local log is in the remote tier: no hole between the tiers.
    assert s["remote_log_end_offset"] >= s["local_log_start_offset"] - 1
    assert s["remote_log_end_offset"] < s["log_end_offset"]
    # Nearly all of the data went remote, in about 1 MiB segments.
    assert s["remote_bytes"] >= (TOTAL_MIB - 4) * MIB
    assert s["remote_segments"] >= TOTAL_MIB - 4
    assert s["remote_bytes"] <= s["remote_segments"] * (SEGMENT_BYTES + 64 * 1024)


def test_remote_objects_match_the_tier_status(env: Env) -> None:
    s = env.status()
    logs = env.tier.segment_objects(TOPIC)
    assert len(logs) == s["remote_segments"]
    assert sum(logs.values()) == s["remote_bytes"]
    starts = sorted(segment_start(k) for k in logs)
    assert starts[0] == 0 and len(set(starts)) == len(starts)
    everything = env.tier.objects(TOPIC)
    manifests = [k for k in everything if k.endswith(".manifest.json")]
    assert len(manifests) == len(logs)  # every segment complete, none half-written
    assert sum(1 for k in everything if k.endswith(".indexes")) == len(logs)
    # Log, indexes, manifest, and the partition's index: nothing else.
    assert sum(1 for k in everything if k.endswith("/partition.json")) == 1
    assert len(everything) == 3 * len(logs) + 1

    # Gauges are refreshed every task interval: poll until they show the settled state.
    def gauges_current() -> str | None:
        t = metrics(env.broker)
        size = metric(t, "RemoteLogSizeBytes", topic=TOPIC, partition="0")
        lag = metric(t, "RemoteCopyLagSegments", topic=TOPIC, partition="0")
        return t if size == s["remote_bytes"] and lag == 0 else None

    text = wait_for(
        gauges_current,
        "the remote-storage gauges to show the tier status",
        10,
        show=lambda: [ln for ln in metrics(env.broker).splitlines() if "partition=" in ln],
    )
    # Copied once each: the bytes copied are exactly the bytes held.
    assert metric(text, "RemoteCopyBytesPerSec_total", topic=TOPIC) == s["remote_bytes"]
    assert metric(text, "RemoteCopyRequestsPerSec_total", topic=TOPIC) == s["remote_segments"]


# 2. Every client reads everything from offset 0 ---------------------------------------------


def test_confluent_reads_everything_from_offset_0(env: Env) -> None:
    fetched_before = metric(metrics(env.broker), "RemoteFetchBytesPerSec_total", topic=TOPIC) or 0
    result = read_confluent(env.broker.bootstrap, TOPIC, 0, env.messages)
    env.timings["confluent_read_s"] = result.seconds
    env.timings["confluent_request_timeouts"] = len(result.errors)
    check_records(result.records, 0, env.messages, VALUE_SIZE)
    # Retriable timeouts of remote reads are allowed, a loop of them is not.
    assert len(result.errors) <= env.settled["remote_segments"], result.errors[:5]
    # What lies below the local log came from the remote tier.
    s = env.status()
    fetched = metric(metrics(env.broker), "RemoteFetchBytesPerSec_total", topic=TOPIC) or 0
    assert fetched - fetched_before >= s["remote_bytes"] - s["local_bytes"]


def test_kcat_reads_everything_from_offset_0(env: Env) -> None:
    result = read_kcat(env.broker.bootstrap, TOPIC)
    env.timings["kcat_read_s"] = result.seconds
    assert result.records[0][:2] == (0, key_of(0))
    assert result.records[-1][:2] == (env.messages - 1, key_of(env.messages - 1))
    check_records(result.records, 0, env.messages, VALUE_SIZE)


def test_aiokafka_reads_everything_from_offset_0(env: Env) -> None:
    result = read_aiokafka(env.broker.bootstrap, TOPIC, env.messages)
    env.timings["aiokafka_read_s"] = result.seconds
    check_records(result.records, 0, env.messages, VALUE_SIZE)


# 3. ListOffsets ---------------------------------------------------------------------------


def test_list_offsets_names_both_tiers(env: Env) -> None:
    s = env.status()
    port = env.broker.port
    answers = {
        t: list_offsets(port, TOPIC, t)
        for t in (EARLIEST, LATEST, EARLIEST_LOCAL, LATEST_TIERED, EARLIEST_PENDING_UPLOAD)
    }
    assert all(a[0] == 0 for a in answers.values()), answers
    offsets = {t: a[1] for t, a in answers.items()}
    assert offsets[EARLIEST] == s["log_start_offset"] == 0
    assert offsets[LATEST] == s["log_end_offset"] == env.messages
    assert offsets[EARLIEST_LOCAL] == s["local_log_start_offset"] > 0
    assert offsets[LATEST_TIERED] == s["remote_log_end_offset"]
    # Everything rolled is tiered, so the first offset not uploaded is where the active
    # segment starts, just past the highest tiered offset.
    assert offsets[EARLIEST_PENDING_UPLOAD] == s["remote_log_end_offset"] + 1
    assert offsets[EARLIEST_LOCAL] <= offsets[EARLIEST_PENDING_UPLOAD] <= offsets[LATEST]
    assert all(a[3] == 0 for a in answers.values()), answers  # leader epoch 0 throughout
    admin = AdminClient({"bootstrap.servers": env.broker.bootstrap})
    tp = TopicPartition(TOPIC, 0)
    earliest = admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(15)
    latest = admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(15)
    assert (earliest.offset, latest.offset) == (0, env.messages)


def test_list_offsets_of_a_topic_that_is_not_tiered(env: Env) -> None:
    """-4 is the log start offset, -5 and -6 are -1 (Kafka: no remote log)."""
    admin = AdminClient({"bootstrap.servers": env.broker.bootstrap})
    admin.create_topics([NewTopic("plain", 1, 1)])["plain"].result(15)
    produce(env.broker.bootstrap, "plain", 0, 10, VALUE_SIZE)
    port = env.broker.port
    assert list_offsets(port, "plain", EARLIEST_LOCAL)[:2] == (0, 0)
    assert list_offsets(port, "plain", LATEST_TIERED)[:2] == (0, -1)
    assert list_offsets(port, "plain", EARLIEST_PENDING_UPLOAD)[:2] == (0, -1)
    assert status(env.broker, "plain") == {}  # not a tiered partition
    admin.delete_topics(["plain"])["plain"].result(15)


def test_list_offsets_by_timestamp_in_the_remote_tier(env: Env) -> None:
    s = env.status()
    local_start = s["local_log_start_offset"]
    remote = [0, 1, 777, local_start // 3, local_start // 2 + 1, local_start - 1]
    local = [local_start, env.messages - 1]
    for k in remote + local:
        error, offset, ts, epoch, _ = list_offsets(env.broker.port, TOPIC, timestamp_of(k))
        assert (error, offset, ts) == (0, k, timestamp_of(k)), (k, local_start)
        assert epoch == 0
    # Before every record: the first one; after every record: none (-1).
    assert list_offsets(env.broker.port, TOPIC, timestamp_of(0) - 60_000)[:3] == (
        0,
        0,
        timestamp_of(0),
    )
    assert list_offsets(env.broker.port, TOPIC, timestamp_of(env.messages) + 1)[:2] == (0, -1)
    # The same through a client.
    consumer = Consumer({"bootstrap.servers": env.broker.bootstrap, "group.id": "times"})
    try:
        k = local_start // 2
        (found,) = consumer.offsets_for_times([TopicPartition(TOPIC, 0, timestamp_of(k))], 15)
        assert found.offset == k
    finally:
        consumer.close()


# 4. kill -9 and restart -------------------------------------------------------------------


STABLE_FIELDS = (
    "log_start_offset",
    "local_log_start_offset",
    "log_end_offset",
    "remote_log_start_offset",
    "remote_log_end_offset",
    "remote_segments",
    "remote_bytes",
)


def test_kill_9_and_restart_keep_everything_and_upload_nothing_twice(env: Env) -> None:
    before = env.status()
    objects_before = env.tier.objects(TOPIC)
    assert before["copy_lag_segments"] == 0
    assert env.broker.stop(signal.SIGKILL) == -signal.SIGKILL
    started = time.monotonic()
    env.broker = env.broker.restarted()
    env.timings["restart_s"] = time.monotonic() - started
    after = wait_for(
        lambda: settled(env.broker, env.messages),
        "the restarted broker to settle",
        60,
        show=env.status,
    )
    assert {f: after[f] for f in STABLE_FIELDS} == {f: before[f] for f in STABLE_FIELDS}
    # Several copy runs later, the remote tier holds exactly the same objects, and this
    # process copied nothing.
    deadline = time.monotonic() + 4 * TASK_INTERVAL_MS / 1000
    while time.monotonic() < deadline:
        assert env.tier.objects(TOPIC) == objects_before, "remote objects changed after the restart"
        time.sleep(0.2)
    copied = metric(metrics(env.broker), "RemoteCopyRequestsPerSec_total", topic=TOPIC)
    assert copied in (None, 0.0), f"{copied} segments copied again after the restart"
    assert env.status()["remote_bytes"] == before["remote_bytes"]

    result = read_confluent(env.broker.bootstrap, TOPIC, 0, env.messages)
    env.timings["confluent_read_after_restart_s"] = result.seconds
    check_records(result.records, 0, env.messages, VALUE_SIZE)
    check_records(read_kcat(env.broker.bootstrap, TOPIC).records, 0, env.messages, VALUE_SIZE)

    # New data tiers as new segments only: every start offset once, old objects untouched.
    extra = 3 * MIB // VALUE_SIZE
    produce(env.broker.bootstrap, TOPIC, env.messages, extra, VALUE_SIZE)
    env.messages += extra
    now = wait_for(
        lambda: (
            (s := settled(env.broker, env.messages))
            and s["remote_log_end_offset"] > before["remote_log_end_offset"]
            and s
        ),
        "the new segments to be tiered",
        60,
        show=env.status,
    )
    objects_now = env.tier.objects(TOPIC)
    assert {k: v for k, v in objects_now.items() if k in objects_before} == objects_before
    new_logs = [k for k in objects_now if k.endswith(".log") and k not in objects_before]
    assert new_logs and all(segment_start(k) > before["remote_log_end_offset"] for k in new_logs)
    starts = [segment_start(k) for k in objects_now if k.endswith(".log")]
    assert len(starts) == len(set(starts)) == now["remote_segments"]
    assert sum(v for k, v in objects_now.items() if k.endswith(".log")) == now["remote_bytes"]

    # Killed again right after new events (the metadata snapshot is older than them): the
    # restart loads the snapshot, replays what follows, and ends in the same state.
    assert (env.data_dir / "logs" / "remote-log-metadata.snapshot").exists()
    env.broker.stop(signal.SIGKILL)
    env.broker = env.broker.restarted()
    again = wait_for(
        lambda: settled(env.broker, env.messages),
        "the second restart to settle",
        60,
        show=env.status,
    )
    assert {f: again[f] for f in STABLE_FIELDS} == {f: now[f] for f in STABLE_FIELDS}
    assert env.tier.objects(TOPIC) == objects_now
    result = read_confluent(env.broker.bootstrap, TOPIC, 0, env.messages)
    check_records(result.records, 0, env.messages, VALUE_SIZE)


# 5. Retention over both tiers -------------------------------------------------------------


def test_lower_retention_bytes_deletes_the_oldest_remote_segments(env: Env) -> None:
    before = env.status()
    logs_before = env.tier.segment_objects(TOPIC)
    retention = 20 * MIB if TOTAL_MIB >= 30 else max(TOTAL_MIB // 2, 4) * MIB
    assert before["remote_bytes"] > retention + 2 * SEGMENT_BYTES
    admin = AdminClient({"bootstrap.servers": env.broker.bootstrap})
    resource = ConfigResource(
        "topic",
        TOPIC,
        incremental_configs=[
            ConfigEntry(
                "retention.bytes", str(retention), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(15)
    # Deleting stops once the excess over retention.bytes (remote + local-only bytes) is below
    # the oldest segment's size.
    s = wait_for(
        lambda: (s := env.status())["remote_bytes"] < retention + SEGMENT_BYTES and s,
        "remote retention to delete the oldest segments",
        60,
        show=env.status,
    )
    assert s["remote_bytes"] >= retention - SEGMENT_BYTES - 64 * 1024, "deleted more than needed"
    low = s["log_start_offset"]
    assert low > 0 and low == s["remote_log_start_offset"]
    assert s["log_end_offset"] == env.messages
    # Remote retention never touches the local tail (local.retention.bytes governs it).
    assert s["local_log_start_offset"] >= before["local_log_start_offset"] > low
    assert s["local_bytes"] <= MAX_LOCAL_BYTES

    consumer = Consumer({"bootstrap.servers": env.broker.bootstrap, "group.id": "low"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), 15) == (low, env.messages)
    finally:
        consumer.close()
    tp = TopicPartition(TOPIC, 0)
    assert admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(15).offset == low
    assert list_offsets(env.broker.port, TOPIC, EARLIEST)[:2] == (0, low)
    # A timestamp older than the log now finds its first record.
    assert list_offsets(env.broker.port, TOPIC, timestamp_of(0))[:2] == (0, low)

    # The objects of exactly the oldest segments are gone.
    def remaining() -> dict[str, int] | None:
        logs = env.tier.segment_objects(TOPIC)
        return logs if len(logs) == s["remote_segments"] else None

    logs = wait_for(remaining, "the deleted segments' objects to go", 30)
    kept = sorted(logs_before, key=segment_start)[-len(logs) :]
    assert sorted(logs) == sorted(kept)
    assert min(segment_start(k) for k in logs) == low
    assert sum(logs.values()) == s["remote_bytes"]

    # Reading at the new start works, below it is out of range.
    answer = fetch(env.broker.port, TOPIC, low, max_wait_ms=500)
    for _ in range(10):  # the first remote read of a segment may outlive remote.fetch.max.wait.ms
        if answer.error == 0 and answer.records:
            break
        answer = fetch(env.broker.port, TOPIC, low, max_wait_ms=500)
    assert answer.error == 0 and answer.log_start_offset == low
    first = next(r for r in decode(answer.records) if r[0] >= low)
    assert first == (low, key_of(low), value_of(low, VALUE_SIZE))
    assert fetch(env.broker.port, TOPIC, 0).error == OFFSET_OUT_OF_RANGE


# 6. DeleteTopics --------------------------------------------------------------------------


def test_delete_topic_removes_every_remote_object(env: Env) -> None:
    assert env.tier.objects(TOPIC)
    admin = AdminClient({"bootstrap.servers": env.broker.bootstrap})
    admin.delete_topics([TOPIC])[TOPIC].result(15)
    wait_for(
        lambda: not env.tier.objects(TOPIC),
        "the deleted topic's remote objects to go",
        60,
        show=lambda: sorted(env.tier.objects(TOPIC))[:5],
    )
    assert env.status() == {}
    # The local log's directory, renamed at once, is removed in a worker thread.
    wait_for(lambda: not any((env.data_dir / "logs").glob(f"{TOPIC}-*")), "the local log to go")
