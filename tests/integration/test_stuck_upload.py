"""An upload that hangs: a broker process copies to moto's S3 server through `HangingS3`,
whose first multipart upload never gets an answer to its second part. The copy task
cancels it at `remote.log.manager.call.timeout.ms`, the plugin aborts the multipart upload
and deletes what the copy wrote, the copy is retried with back-off and succeeds, and the
bucket holds no partial object and no open multipart upload.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import ROOT, BrokerProcess
from tests.integration.moto_server import InstrumentedS3, MotoServer, moto, rsm_configs  # noqa: F401
from tests.integration.tiering_helpers import MIB, metric, metrics, produce, status
from tests.integration.waiting import wait_for

BUCKET = "stuck"
PART_BYTES = 5 * MIB  # S3's smallest part: a 6 MiB segment goes up in two parts
SEGMENT_BYTES = 6 * MIB
CALL_TIMEOUT_MS = 2000
HANG_S = 3600.0  # longer than the test: only the cancellation ends it


class HangingS3(InstrumentedS3):
    """The S3 plugin whose first `rsm.config.hang.copies` multipart uploads hang on their
    second part; each call of interest is a JSON line in `rsm.config.hang.journal`."""

    def configure(self, configs: Mapping[str, str]) -> None:
        super().configure(configs)
        self.hangs_left = int(configs["hang.copies"])
        self.journal = Path(configs["hang.journal"])
        self.faulty.hooks.append(self._hook)

    async def _hook(self, method: str, kwargs: dict[str, Any]) -> None:
        if method not in ("upload_part", "abort_multipart_upload", "complete_multipart_upload"):
            return
        hang = method == "upload_part" and kwargs["PartNumber"] == 2 and self.hangs_left > 0
        self._note({"method": method, "key": kwargs["Key"], "hang": hang})
        if hang:
            self.hangs_left -= 1
            await asyncio.sleep(HANG_S)

    def _note(self, call: dict[str, Any]) -> None:
        with open(self.journal, "a") as f:
            f.write(json.dumps(call) + "\n")


def journal(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_hung_upload_is_cancelled_cleaned_up_and_retried(
    moto: MotoServer,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    moto.create_bucket(BUCKET)
    journal_path = tmp_path / "hang-journal.jsonl"
    rsm = rsm_configs(
        moto.endpoint,
        BUCKET,
        **{"storage.s3.multipart.upload.part.size": str(PART_BYTES), "hang.copies": "1"},
    )
    overrides = {
        "remote.log.storage.manager.class.name": f"{__name__}.HangingS3",
        "remote.log.storage.manager.class.path": str(ROOT),
        **{f"rsm.config.{k}": v for k, v in rsm.items()},
        "rsm.config.hang.journal": str(journal_path),
        "remote.log.manager.call.timeout.ms": str(CALL_TIMEOUT_MS),
        "remote.log.manager.task.interval.ms": "500",
        "remote.log.manager.task.retry.backoff.ms": "100",
        "remote.log.manager.task.retry.backoff.max.ms": "1000",
    }
    broker = BrokerProcess(tmp_path, overrides).start()
    topic = "stuck-upload"
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES)}
        admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(15)
        produce(broker.bootstrap, topic, 0, 13 * 1024, 1024, batch_size=65536)
        s = wait_for(
            lambda: (
                (s := status(broker, topic))["remote_segments"] == 2
                and s["copy_lag_segments"] == 0
                and s
            ),
            "both rolled segments copied after the hung upload",
            60,
            show=lambda: (status(broker, topic), journal(journal_path)[-5:]),
        )
        calls = journal(journal_path)
        [hung] = [c for c in calls if c["hang"]]
        # The hung upload was aborted, never completed; the retry went up whole.
        assert {"method": "abort_multipart_upload", "key": hung["key"], "hang": False} in calls
        completed = [c["key"] for c in calls if c["method"] == "complete_multipart_upload"]
        assert hung["key"] not in completed and len(completed) == 2

        client = moto.client()
        wait_for(
            lambda: not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads"),
            "no multipart upload left open",
            15,
        )
        keys = {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])}
        hung_segment = hung["key"].rsplit("/", 1)[-1].removesuffix(".log")
        assert not [k for k in keys if hung_segment in k], "the hung copy left objects"
        logs = {k.removesuffix(".log") for k in keys if k.endswith(".log")}
        manifests = {k.removesuffix(".manifest.json") for k in keys if k.endswith(".manifest.json")}
        assert logs == manifests and len(logs) == s["remote_segments"]

        assert metric(metrics(broker), "RemoteCopyErrorsPerSec_total", topic=topic) == 1
        failures = [line for line in broker.log().splitlines() if "copy task of" in line]
        assert len(failures) == 1 and f"took over {CALL_TIMEOUT_MS / 1000:g} s" in failures[0]
    finally:
        broker.kill()
    assert "Traceback" not in broker.log(), broker.log()[-5000:]
