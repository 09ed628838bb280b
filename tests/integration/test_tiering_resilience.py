"""A remote tier that is down, failing or slow never slows produce or local fetch; tiering and
remote reads back off and resume; fetches never hang; nothing is lost, nothing is deleted
locally before it is in the remote tier.

S3 outages run on moto's standalone server in two ways: stopped (the helper's stop/start:
connections refused, and moto comes back empty) and frozen (SIGSTOP/SIGCONT of the moto
process this test started: connections hang, state kept). Failures and slowness of a plugin
are injected by `FlakyLocalFs` below, which the broker loads by its class path.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
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
)

from tests.integration import tiering_helpers
from tests.integration.broker_process import ROOT, BrokerProcess
from tests.integration.tiering_helpers import (
    REQUEST_TIMED_OUT,
    LocalFsTier,
    all_status,
    check_records,
    decode,
    fetch,
    key_of,
    list_offsets,
    metric,
    metrics,
    read_confluent,
    status,
    timestamp_of,
    value_of,
)
from tests.integration.waiting import wait_for
from tierbroker.storage.remote.key_layout import LOG_SUFFIX, MANIFEST_SUFFIX
from tierbroker.storage.remote.local_fs import LocalFsRemoteStorageManager
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata
from tierbroker.storage.remote.storage_manager import IndexType, LogSegmentData, RemoteStorageError

VALUE_SIZE = 500
SEGMENT_BYTES = 256 * 1024
TIERED = {
    "remote.storage.enable": "true",
    "segment.bytes": str(SEGMENT_BYTES),
    "local.retention.bytes": str(512 * 1024),
}
FETCH_MAX_WAIT_MS = 500
FAST = {
    "remote.log.manager.task.interval.ms": "500",
    "log.retention.check.interval.ms": "500",
    "remote.log.manager.task.retry.backoff.ms": "100",
    "remote.log.manager.task.retry.backoff.max.ms": "1000",
    "remote.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
}


# The plugin ---------------------------------------------------------------------------------


class FlakyLocalFs(LocalFsRemoteStorageManager):
    """LocalFs with injected trouble, configured by `rsm.config.flaky.*`:

    - `flaky.copy.failures`: the first N copies upload the segment's log, then fail;
    - `flaky.fetch.delay.ms` / `flaky.index.delay.ms`: every segment read / index download
      takes that long;
    - `flaky.manifest.pause.ms`: a copy pauses that long before writing its manifest;
    - `flaky.journal`: a file where every call is recorded as a JSON line.
    """

    def configure(self, configs: Mapping[str, str]) -> None:
        super().configure(configs)
        self.copy_failures = int(configs.get("flaky.copy.failures", "0"))
        self.fetch_delay_s = int(configs.get("flaky.fetch.delay.ms", "0")) / 1000
        self.index_delay_s = int(configs.get("flaky.index.delay.ms", "0")) / 1000
        self.manifest_pause_s = int(configs.get("flaky.manifest.pause.ms", "0")) / 1000
        journal = configs.get("flaky.journal")
        self.journal = Path(journal) if journal else None

    def _note(self, op: str, metadata: RemoteLogSegmentMetadata, **extra: Any) -> None:
        if self.journal is not None:
            line = {
                "op": op,
                "t": time.time(),
                "segment": str(metadata.segment_id.id),
                "start": metadata.start_offset,
                "end": metadata.end_offset,
                **extra,
            }
            with open(self.journal, "a") as f:
                f.write(json.dumps(line) + "\n")

    async def copy_log_segment_data(
        self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData
    ) -> bytes:
        self._note("copy-start", metadata)
        if self.copy_failures > 0:
            self.copy_failures -= 1
            # What a dropped connection leaves: part of the segment uploaded, then an error.
            log = data.log_segment.read_bytes()
            await self._run(self._write, self.layout.segment_key(metadata, LOG_SUFFIX), log)
            self._note("copy-fail", metadata)
            raise RemoteStorageError("injected copy failure")
        custom = await super().copy_log_segment_data(metadata, data)
        self._note("copy-done", metadata)
        return custom

    def _write(self, key: str, data: bytes) -> dict[str, Any]:  # in the executor
        if key.endswith(MANIFEST_SUFFIX) and self.manifest_pause_s:
            time.sleep(self.manifest_pause_s)
        return super()._write(key, data)

    async def fetch_log_segment(
        self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None = None
    ) -> bytes:
        self._note("fetch-start", metadata, position=start)
        await asyncio.sleep(self.fetch_delay_s)
        data = await super().fetch_log_segment(metadata, start, end)
        self._note("fetch-end", metadata, position=start)
        return data

    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        self._note("index-start", metadata, index=index_type.value)
        await asyncio.sleep(self.index_delay_s)
        data = await super().fetch_index(metadata, index_type)
        self._note("index-end", metadata, index=index_type.value)
        return data


def journal(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def flaky_broker(tmp_path: Path, **flaky: str) -> tuple[BrokerProcess, Path]:
    journal_path = tmp_path / "flaky-journal.jsonl"
    overrides = {
        **FAST,
        "remote.log.storage.manager.class.name": f"{__name__}.FlakyLocalFs",
        "remote.log.storage.manager.class.path": str(ROOT),
        "rsm.config.flaky.journal": str(journal_path),
        **{f"rsm.config.flaky.{k.replace('_', '.')}": v for k, v in flaky.items()},
    }
    return BrokerProcess(tmp_path, overrides), journal_path


# Helpers ------------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, start: int, count: int, value_size: int, **kw: Any) -> Any:
    """Small batches (16 KiB), so that segments are about segment.bytes and none is huge."""
    return tiering_helpers.produce(
        bootstrap, topic, start, count, value_size, batch_size=16384, **kw
    )


def create_topic(broker: BrokerProcess, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={**TIERED, **configs})])[topic].result(15)


def tiered_up_to(broker: BrokerProcess, topic: str, log_end: int) -> dict[str, Any] | None:
    """The status once everything rolled is tiered and local retention trimmed the log."""
    s = status(broker, topic)
    ok = (
        s
        and s["log_end_offset"] == log_end
        and s["copy_lag_segments"] == 0
        and s["local_log_start_offset"] > 0
        and s["local_bytes"] <= 512 * 1024 + 2 * SEGMENT_BYTES + 64 * 1024
    )
    return s if ok else None


def fill_and_tier(broker: BrokerProcess, topic: str, count: int) -> dict[str, Any]:
    """Create `topic`, produce `count` records, and wait until they are tiered; the status."""
    create_topic(broker, topic)
    produce(broker.bootstrap, topic, 0, count, VALUE_SIZE)
    return wait_for(
        lambda: tiered_up_to(broker, topic, count),
        "tiering",
        60,
        show=lambda: status(broker, topic),
    )


MIN_POLLS = 10


class StatusMonitor:
    """Polls /tier/status every 100 ms in a thread and records every poll where the local log
    starts above the remote tier's end + 1 (local data deleted before it was tiered)."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        self.broker, self.topic = broker, topic
        self.polls = 0
        self.violations: list[dict[str, Any]] = []
        self.max_copy_lag = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StatusMonitor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        deadline = time.monotonic() + 10
        while self.polls < MIN_POLLS and time.monotonic() < deadline:  # a fast run: poll on
            time.sleep(0.1)
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                s = status(self.broker, self.topic)
            except OSError as e:  # the status endpoint must answer during outages too
                self.errors.append(repr(e))
                s = {}
            if s:
                self.polls += 1
                self.max_copy_lag = max(self.max_copy_lag, s["copy_lag_segments"])
                if s["local_log_start_offset"] > s["remote_log_end_offset"] + 1:
                    self.violations.append(s)
            self._stop.wait(0.1)

    def check(self) -> None:
        assert not self.errors, self.errors[:3]
        assert self.polls >= MIN_POLLS, self.polls
        assert not self.violations, f"deleted locally before tiered: {self.violations[:3]}"


class TailConsumer:
    """A confluent consumer following the end of partition 0."""

    def __init__(self, bootstrap: str, topic: str, start: int) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"tail-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
            }
        )
        self.consumer.assign([TopicPartition(topic, 0, start)])
        self.next = start

    def read(self, count: int, value_size: int, timeout_s: float = 15) -> float:
        """Read the next `count` records, check them, and return the seconds it took."""
        started = time.monotonic()
        got: list[tuple[int, bytes | None, bytes | None]] = []
        while len(got) < count:
            assert time.monotonic() - started < timeout_s, (
                f"tail consumer: {len(got)} of {count} records in {timeout_s}s"
            )
            for m in self.consumer.consume(count - len(got), 0.2):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.key(), m.value()))
        check_records(got, self.next, count, value_size)
        self.next += count
        return time.monotonic() - started

    def close(self) -> None:
        self.consumer.close()


def assert_remote_fetch_answers_in_time(
    broker: BrokerProcess, topic: str, offset: int, hung: bool
) -> list[tuple[int, int]]:
    """A fetch at an offset in the remote tier answers, with an error or without records,
    while the tier is unreachable; against a hung tier, with REQUEST_TIMED_OUT: at its own
    wait (remote.fetch.max.wait.ms), not when the plugin's calls give up. (A later fetch
    that joins the read as the plugin gives up gets the read's error instead.)"""
    answers = []
    for _ in range(3):  # repeated: reads piling up must not make later fetches hang
        a = fetch(broker.port, topic, offset, max_wait_ms=FETCH_MAX_WAIT_MS, socket_timeout_s=30)
        answers.append((a.error, len(a.records)))
        assert a.error != 0 or not a.records, answers
    if hung:
        assert answers[0][0] == REQUEST_TIMED_OUT, answers
    return answers


def set_topic_config(broker: BrokerProcess, topic: str, name: str, value: str) -> None:
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(15)


# S3 outages ---------------------------------------------------------------------------------


@dataclass
class Moto:
    """The moto server of one test, and how it goes down and comes back."""

    mode: str
    server: Any
    bucket: str = "outage"
    frozen: bool = False
    events: list[str] = field(default_factory=list)

    def down(self) -> None:
        if self.mode == "stopped":
            self.server.stop()
        else:  # a process this test started, by its pid
            os.kill(self.server.process.pid, signal.SIGSTOP)
            self.frozen = True
        self.events.append(f"down {time.monotonic():.1f}")

    def up(self) -> None:
        if self.mode == "stopped":
            self.server.start()  # same port, empty: the bucket must be created again
            self.server.create_bucket(self.bucket)
        else:
            os.kill(self.server.process.pid, signal.SIGCONT)
            self.frozen = False
        self.events.append(f"up {time.monotonic():.1f}")

    def close(self) -> None:
        if self.frozen and self.server.process is not None:
            os.kill(self.server.process.pid, signal.SIGCONT)
        self.server.stop()


@pytest.fixture(params=["stopped", "frozen"])
def moto(request: pytest.FixtureRequest) -> Iterator[Moto]:
    from tests.integration.moto_server import MotoServer

    server = MotoServer().start()
    m = Moto(request.param, server)
    server.create_bucket(m.bucket)
    try:
        yield m
    finally:
        m.close()


def s3_broker(tmp_path: Path, m: Moto, **extra: str) -> BrokerProcess:
    return BrokerProcess(
        tmp_path,
        {
            **FAST,
            **m.server.rsm_overrides(m.bucket),
            # Fail fast on a hung S3 so copies back off quickly (per attempt, 2 attempts).
            "rsm.config.storage.s3.api.call.timeout.ms": "1500",
            "rsm.config.storage.s3.retry.max.attempts": "2",
            "rsm.config.storage.s3.retry.backoff.ms": "50",
            **extra,
        },
    )


def test_s3_outage_slows_neither_produce_nor_local_consume_and_loses_nothing(
    tmp_path: Path, moto: Moto
) -> None:
    broker = s3_broker(tmp_path, moto).start()
    topic = "outage"
    try:
        create_topic(broker, topic)
        # Before: tiering works, the first segments are remote only.
        baseline = produce(broker.bootstrap, topic, 0, 4000, VALUE_SIZE)
        end = 4000
        before = wait_for(
            lambda: tiered_up_to(broker, topic, end),
            "the first segments to be tiered",
            60,
            show=lambda: status(broker, topic),
        )
        tail = TailConsumer(broker.bootstrap, topic, end)
        with StatusMonitor(broker, topic) as monitor:
            moto.down()
            rounds = []
            for _ in range(6):  # keep producing (acks=1) and consuming the tail
                report = produce(broker.bootstrap, topic, end, 1000, VALUE_SIZE, timeout_s=30)
                consumed_s = tail.read(1000, VALUE_SIZE)
                rounds.append(
                    (round(report.seconds, 2), round(report.max_latency_s, 2), round(consumed_s, 2))
                )
                end += 1000
            # Tiering could not keep up: the lag grew and the rolled segments stayed local.
            during = wait_for(
                lambda: (s := status(broker, topic))["copy_lag_segments"] >= 6 and s,
                "the copy lag to grow",
                30,
                show=lambda: status(broker, topic),
            )
            assert during["remote_log_end_offset"] == before["remote_log_end_offset"]
            assert during["local_log_start_offset"] <= before["remote_log_end_offset"] + 1
            wait_for(
                lambda: metric(metrics(broker), "RemoteCopyErrorsPerSec_total", topic=topic),
                "failed copies to be counted",
                30,
            )
            # A fetch of remote data answers, in time, and never hangs.
            remote_answers = assert_remote_fetch_answers_in_time(
                broker, topic, 0, hung=moto.mode == "frozen"
            )
            # A fetch of local data is served as usual.
            local = fetch(broker.port, topic, end - 10, max_wait_ms=FETCH_MAX_WAIT_MS)
            assert local.error == 0
            assert next(r for r in decode(local.records) if r[0] >= end - 10) == (
                end - 10,
                key_of(end - 10),
                value_of(end - 10, VALUE_SIZE),
            )
            moto.up()
            after = wait_for(
                lambda: tiered_up_to(broker, topic, end),
                "tiering to catch up after the outage",
                90,
                show=lambda: status(broker, topic),
            )
            assert after["local_log_start_offset"] > before["remote_log_end_offset"] + 1
        monitor.check()
        tail.close()
        # Nothing is lost. A stopped moto came back empty, so what was tiered before the outage
        # is gone from it (a property of the test server): read from where the outage began.
        start = 0 if moto.mode == "frozen" else 4000
        result = read_confluent(broker.bootstrap, topic, start, end - start, timeout_s=90)
        check_records(result.records, start, end - start, VALUE_SIZE)
        print(
            f"\n[{moto.mode}] baseline produce {baseline.seconds:.2f}s; rounds "
            f"(produce s, max latency s, tail s): {rounds}; remote fetches {remote_answers}; "
            f"max copy lag {monitor.max_copy_lag}; polls {monitor.polls}"
        )
    finally:
        broker.kill()
    # A stopped moto comes back without the bucket until the test creates it again; errors of
    # that moment are the test's doing. Nothing else may fail with a traceback.
    unexpected = [
        chunk
        for chunk in broker.log().split("Traceback")[1:]
        if not (moto.mode == "stopped" and "NoSuchBucket" in chunk.split("\n[")[0])
    ]
    assert not unexpected, unexpected[0][-3000:]


def test_list_offsets_by_a_remote_timestamp_answers_within_its_timeout_while_s3_hangs(
    tmp_path: Path,
) -> None:
    """ListOffsets v10+ carries a timeout for lookups in the remote tier (KIP-1075): while S3
    hangs, a timestamp lookup in the remote tier must answer within it, not block the
    connection for the plugin's own retries."""
    from tests.integration.moto_server import MotoServer

    m = Moto("frozen", MotoServer().start())
    m.server.create_bucket(m.bucket)
    broker = s3_broker(
        tmp_path,
        m,
        **{
            "rsm.config.storage.s3.api.call.timeout.ms": "5000",
            "rsm.config.storage.s3.retry.max.attempts": "3",
        },
    ).start()
    topic = "times"
    try:
        s = fill_and_tier(broker, topic, 4000)
        k = s["local_log_start_offset"] // 2
        assert list_offsets(broker.port, topic, timestamp_of(k))[:3] == (0, k, timestamp_of(k))
        m.down()
        error, offset, _, _, seconds = list_offsets(
            broker.port, topic, timestamp_of(k // 2), timeout_ms=1000
        )
        # Answered at its own timeout, before even one of the plugin's calls (5 s) gave up.
        # (Or from a time index cached by the first lookup, without the plugin.)
        assert error == REQUEST_TIMED_OUT or (error, offset) == (0, k // 2), (error, seconds)
        # Produce goes on meanwhile.
        produce(broker.bootstrap, topic, 4000, 100, VALUE_SIZE, timeout_s=10)
    finally:
        m.close()
        broker.kill()


# A failing and slow plugin ------------------------------------------------------------------


def test_failed_copies_retry_with_back_off_leave_nothing_behind_and_succeed(tmp_path: Path) -> None:
    broker, journal_path = flaky_broker(tmp_path, copy_failures="4")
    # A task interval longer than the test: only the retry back-off (100 ms doubling to 1 s)
    # brings the retries. A config change runs the copy task once, after the produce.
    broker.overrides["remote.log.manager.task.interval.ms"] = "600000"
    broker.start()
    topic = "flaky"
    tier = LocalFsTier(tmp_path)
    try:
        create_topic(broker, topic)
        with StatusMonitor(broker, topic) as monitor:
            produce(broker.bootstrap, topic, 0, 5000, VALUE_SIZE)
            set_topic_config(broker, topic, "remote.log.copy.disable", "false")
            s = wait_for(
                lambda: tiered_up_to(broker, topic, 5000),
                "copies to succeed after the failures, retried by the back-off",
                60,
                show=lambda: status(broker, topic),
            )
        monitor.check()
        calls = journal(journal_path)
        failed = [c for c in calls if c["op"] == "copy-fail"]
        done = [c for c in calls if c["op"] == "copy-done"]
        assert len(failed) == 4
        assert all(c["start"] == 0 for c in failed)  # the oldest segment, retried each time
        assert any(c["start"] == 0 for c in done)
        # Nothing of the failed attempts is left, every segment is in the tier once, complete.
        objects = tier.objects(topic)
        for c in failed:
            assert not [k for k in objects if c["segment"] in k], (
                f"failed copy {c['segment']} left objects"
            )
        logs = [k for k in objects if k.endswith(".log")]
        manifests = [k for k in objects if k.endswith(".manifest.json")]
        assert len(logs) == len(manifests) == s["remote_segments"] == len(done)
        assert metric(metrics(broker), "RemoteCopyErrorsPerSec_total", topic=topic) == 4
        result = read_confluent(broker.bootstrap, topic, 0, 5000)
        check_records(result.records, 0, 5000, VALUE_SIZE)
    finally:
        broker.kill()


@pytest.mark.parametrize("slow", ["segment", "index"])
def test_a_slow_remote_read_times_out_then_serves_the_retry_and_consumers_progress(
    tmp_path: Path, slow: str
) -> None:
    delay = {"fetch_delay_ms" if slow == "segment" else "index_delay_ms": "1500"}
    broker, journal_path = flaky_broker(tmp_path, **delay)
    broker.start()
    topic = "slow"
    try:
        s = fill_and_tier(broker, topic, 5000)
        assert s["local_log_start_offset"] > 1000

        if slow == "index":
            # A timestamp in the remote tier needs its time index: the client's timeout holds.
            error, *_ = list_offsets(broker.port, topic, 0, timeout_ms=300)
            assert error == REQUEST_TIMED_OUT, error  # the 1.5 s read would have answered

        # A read from a segment's first offset needs no index: the index case reads inside one.
        offset = 0 if slow == "segment" else 1
        first = fetch(broker.port, topic, offset, max_wait_ms=FETCH_MAX_WAIT_MS)
        assert first.error == REQUEST_TIMED_OUT, first  # answered at the fetch's wait
        # The read goes on after the fetch gave up: wait until the plugin finished it.
        op = "fetch-end" if slow == "segment" else "index-end"
        wait_for(
            lambda: any(c["op"] == op for c in journal(journal_path)), "the slow read to finish", 10
        )
        if slow == "index":  # the segment read follows the index download
            wait_for(
                lambda: any(c["op"] == "fetch-end" for c in journal(journal_path)),
                "the read to finish",
                10,
            )

        def call(c: dict[str, Any]) -> tuple[Any, ...]:
            return c["op"], c["segment"], c.get("position"), c.get("index")

        seen = journal(journal_path)
        first_read = {call(c) for c in seen if c["op"] in ("fetch-start", "index-start")}
        retry = fetch(broker.port, topic, offset, max_wait_ms=FETCH_MAX_WAIT_MS)
        assert retry.error == 0 and retry.records, retry
        assert (offset, key_of(offset), value_of(offset, VALUE_SIZE)) in decode(retry.records)
        # The retry may start a read ahead (the next range) but never reads its own again.
        again = [c for c in journal(journal_path)[len(seen) :] if call(c) in first_read]
        assert not again, f"the retry read the remote tier again: {again}"

        # A consumer reading through slow remote reads gets everything, making progress.
        result = read_confluent(broker.bootstrap, topic, 0, 5000, timeout_s=90)
        check_records(result.records, 0, 5000, VALUE_SIZE)
        reads = len([c for c in journal(journal_path) if c["op"] == "fetch-start"])
        print(
            f"\n[{slow}] consumer: {result.seconds:.1f}s, {len(result.errors)} timeouts, "
            f"{reads} remote reads"
        )
    finally:
        broker.kill()


# DeleteTopics while a copy is in flight ------------------------------------------------------


def test_delete_topic_during_a_copy_leaves_no_remote_object(tmp_path: Path) -> None:
    broker, journal_path = flaky_broker(tmp_path, manifest_pause_ms="2000")
    broker.start()
    topic = "doomed"
    tier = LocalFsTier(tmp_path)
    try:
        create_topic(broker, topic)
        produce(broker.bootstrap, topic, 0, 2000, VALUE_SIZE)
        wait_for(
            lambda: any(c["op"] == "copy-start" for c in journal(journal_path)),
            "a copy to start",
            30,
        )
        wait_for(
            lambda: [k for k in tier.objects(topic) if k.endswith(".log")],
            "the copy's log to be written",
            10,
        )
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics([topic])[topic].result(15)
        # Let the paused copy finish writing (it cannot be recalled), then everything must go.
        wait_for(
            lambda: any(c["op"] == "copy-done" for c in journal(journal_path)),
            "the paused copy to end",
            15,
        )
        wait_for(
            lambda: not tier.objects(topic),
            "the deleted topic's remote objects to go",
            20,
            show=lambda: sorted(tier.objects(topic)),
        )
        assert not [r for r in all_status(broker) if r["topic"] == topic]
    finally:
        broker.kill()
