"""The `tierbroker` Spark source's reader, run without a Spark session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_pipeline_discovery import CLUSTER, TOPIC, copy_segment, record_ts, rsm_for
from tierbroker.pipeline.spark.source import KAFKA_SCHEMA_WITHOUT_HEADERS, TierbrokerDataSource


async def test_a_timestamp_beyond_sparks_range_fails_the_read_naming_its_offset(
    tmp_path: Path,
) -> None:
    remote, work = tmp_path / "remote", tmp_path / "work"
    work.mkdir()
    far = 2**62  # ms: fits Kafka's int64, not Spark's microseconds
    await copy_segment(
        rsm_for(remote), work, 0, 0, 19, timestamp=lambda o: far if o == 13 else record_ts(o)
    )
    options = {"storage": remote.as_uri(), "topic": TOPIC, "cluster": CLUSTER}
    reader = TierbrokerDataSource(options).reader(KAFKA_SCHEMA_WITHOUT_HEADERS)
    [partition] = reader.partitions()
    with pytest.raises(ValueError, match=f"offset 13 has timestamp {far} ms"):
        list(reader.read(partition))
