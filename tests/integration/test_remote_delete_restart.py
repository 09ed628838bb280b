"""Deleting a tiered topic survives a crash: a broker process deleting the remote data of
a topic of a few hundred small segments is killed (SIGKILL) midway; the broker started
again on the same data dir finds the deleted topic's remote metadata, deletes what is
left, reports its progress (log lines, `RemoteDeleteLagSegments`) and leaves no object of
the topic in the LocalFs tier. Each remote delete is slowed (`SlowDeleteLocalFs`), so the
kill lands in the middle.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import ROOT, BrokerProcess
from tests.integration.tiering_helpers import LocalFsTier, metric, metrics, produce, status
from tests.integration.waiting import wait_for
from tierbroker.storage.remote.local_fs import LocalFsRemoteStorageManager
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata

SEGMENT_BYTES = 16 * 1024
RECORDS = 4000  # of 1 KiB: about 250 segments
TOPIC = "doomed"


class SlowDeleteLocalFs(LocalFsRemoteStorageManager):
    """LocalFs whose segment deletes each take `rsm.config.slow.delete.ms` first."""

    def configure(self, configs: Mapping[str, str]) -> None:
        super().configure(configs)
        self.delete_delay_s = int(configs["slow.delete.ms"]) / 1000

    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        await asyncio.sleep(self.delete_delay_s)
        await super().delete_log_segment_data(metadata)


def segments_in_tier(tier: LocalFsTier) -> int:
    return len(tier.segment_objects(TOPIC))


def lag(broker: BrokerProcess) -> float | None:
    return metric(metrics(broker), "RemoteDeleteLagSegments", topic=TOPIC, partition="0")


def test_a_topic_deletion_killed_midway_finishes_after_the_restart(tmp_path: Path) -> None:
    overrides = {
        "remote.log.storage.manager.class.name": f"{__name__}.SlowDeleteLocalFs",
        "remote.log.storage.manager.class.path": str(ROOT),
        "rsm.config.slow.delete.ms": "20",
        "remote.log.manager.task.interval.ms": "200",
        "log.retention.check.interval.ms": "200",
    }
    broker = BrokerProcess(tmp_path, overrides).start()
    tier = LocalFsTier(tmp_path)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {
            "remote.storage.enable": "true",
            "segment.bytes": str(SEGMENT_BYTES),
            "local.retention.bytes": str(4 * SEGMENT_BYTES),
        }
        admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(15)
        produce(broker.bootstrap, TOPIC, 0, RECORDS, 1024, batch_size=8192)
        tiered = wait_for(
            lambda: (
                (s := status(broker, TOPIC))["copy_lag_segments"] == 0
                and s["log_end_offset"] == RECORDS
                and s
            ),
            "the topic tiered",
            60,
            show=lambda: status(broker, TOPIC),
        )
        total = tiered["remote_segments"]
        assert total >= 200 and segments_in_tier(tier) == total

        admin.delete_topics([TOPIC])[TOPIC].result(15)
        seen_lag = wait_for(
            lambda: segments_in_tier(tier) <= total - 20 and lag(broker),
            "the deletion to be under way",
            30,
        )
        broker.kill()
        left = segments_in_tier(tier)
        assert 0 < left < total and seen_lag > 0
    finally:
        broker.kill()
    first_log = broker.log()

    broker = broker.restarted()
    try:
        wait_for(
            lambda: not tier.objects(TOPIC),
            "the rest of the topic's remote objects to go after the restart",
            60,
            show=lambda: (segments_in_tier(tier), lag(broker)),
        )
        wait_for(lambda: lag(broker) is None, "the delete lag gauge to go", 10)
        log = broker.log()[len(first_log) :]
        resumed = re.findall(r"deleting the remote data of the deleted partition: (\d+)", log)[0]
        assert 0 < int(resumed) <= left + 1  # + the segment whose delete the kill cut short
        assert f"100 of {resumed} remote segments deleted" in log
        assert f"remote data deleted ({resumed} segments)" in log
    finally:
        broker.kill()
    assert "Traceback" not in broker.log(), broker.log()[-5000:]
