"""The S3 plugin alone, copying segments to moto's server, against PutObject of the same bytes.

    python -m benchmarks.s3_copy [--segments 24] [--rounds 3]

Per round: `S3RemoteStorageManager.copy_log_segment_data` for N segments of 8 MiB
(with small index files), then N `put_object` calls of the same log bytes on an
aiobotocore client with the plugin's checksum setting. Reported: MB/s of each, the
ratio, and the CPU seconds of the event loop's thread and of the whole process
during the copies (the plugin reads and hashes bodies in executor threads).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from benchmarks.tiering import Moto
from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.server.memory import reuse_large_buffers
from tierbroker.storage.remote.s3 import S3RemoteStorageManager
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    TopicIdPartition,
)
from tierbroker.storage.remote.storage_manager import LogSegmentData
from tierbroker.storage.topic_partition import TopicPartition

SEGMENT_BYTES = 8 * 1024 * 1024 - 5000  # a rolled 8 MiB segment
TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("bench", 0))


def segment_files(directory: Path) -> LogSegmentData:
    files = {}
    for suffix, size in (("log", SEGMENT_BYTES), ("index", 8192), ("timeindex", 12288)):
        files[suffix] = directory / f"00000000000000000000.{suffix}"
        files[suffix].write_bytes(os.urandom(size))
    return LogSegmentData(files["log"], files["index"], files["timeindex"], None, None, b"0\n0\n")


def metadata(i: int) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(TIP),
        start_offset=i * 1000,
        end_offset=i * 1000 + 999,
        max_timestamp_ms=0,
        broker_id=0,
        event_timestamp_ms=0,
        segment_size_bytes=SEGMENT_BYTES,
        segment_leader_epochs=((0, 0),),
    )


async def run(moto: Moto, data: LogSegmentData, segments: int, rounds: int) -> None:
    configs = BrokerConfig.model_validate(moto.overrides()).rsm_configs  # as the broker passes them
    client_args = {
        "region_name": "us-east-1",
        "endpoint_url": configs["storage.s3.endpoint.url"],
        "aws_access_key_id": "t",
        "aws_secret_access_key": "t",
        "verify": False,
        "config": AioConfig(
            s3={"addressing_style": "path"}, request_checksum_calculation="when_required"
        ),
    }
    body = data.log_segment.read_bytes()
    mb = segments * len(body) / 1e6
    async with get_session().create_client("s3", **client_args) as s3:
        for round_ in range(1, rounds + 1):
            rsm = S3RemoteStorageManager()
            rsm.configure(configs)
            await rsm.start()
            started, cpu, loop_cpu = time.perf_counter(), time.process_time(), time.thread_time()
            for i in range(segments):
                await rsm.copy_log_segment_data(metadata(i), data)
            plugin_s = time.perf_counter() - started
            cpu, loop_cpu = time.process_time() - cpu, time.thread_time() - loop_cpu
            await rsm.close()
            started = time.perf_counter()
            for i in range(segments):
                await s3.put_object(Bucket="bench", Key=f"raw/{round_}/{i}", Body=body)
            raw_s = time.perf_counter() - started
            print(
                f"round {round_}: plugin {mb / plugin_s:6.1f} MB/s (loop {loop_cpu:.2f} CPU s,"
                f" process {cpu:.2f})  PutObject {mb / raw_s:6.1f} MB/s"
                f"  ratio {raw_s / plugin_s:.2f}",
                flush=True,
            )


def main() -> None:
    reuse_large_buffers()  # as the broker does
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--segments", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    moto = Moto()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-s3-copy-") as tmp:
            asyncio.run(run(moto, segment_files(Path(tmp)), args.segments, args.rounds))
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
