"""Log against a model: random appends, rolls, retention, restarts (clean and crashed)
and truncations; every read equals what the model holds."""

from __future__ import annotations

import itertools
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tierbroker.protocol.records import build_batch, decode_records
from tierbroker.storage.log import Log, LogStartOffsetIncrementReason
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_partition import TopicPartition

CLIENT_RECORD_DELETION = LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION

TP = TopicPartition("model", 0)
TOPIC_ID = uuid.uuid4()
CONFIG = LogConfig(segment_bytes=600, index_interval_bytes=100, retention_ms=-1, segment_ms=10**12)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name) / str(TP)
        self.log = Log(self.dir, TP, CONFIG, TOPIC_ID)
        self.batches: list[tuple[int, list[bytes]]] = []  # (base offset, values)
        self.epoch = 0
        self.counter = 0
        self.end = 0  # the model's log end offset

    def teardown(self) -> None:
        self.log.close()
        self.tmp.cleanup()

    @rule(count=st.integers(1, 8), size=st.integers(0, 120), new_epoch=st.booleans())
    def append(self, count: int, size: int, new_epoch: bool) -> None:
        if new_epoch:
            self.epoch += 1
        values = []
        for _ in range(count):
            self.counter += 1
            values.append(self.counter.to_bytes(4, "big") * (size // 4 + 1))
        batch = build_batch([(None, v, [], 1_000 + self.counter) for v in values])
        info = self.log.append_as_leader(bytearray(batch), self.epoch)
        assert info.first_offset == self.end
        self.batches.append((info.first_offset, values))
        self.end += count
        self.log.update_high_watermark(self.log.log_end_offset)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(retention_bytes=st.integers(0, 2000))
    def retention_by_size(self, retention_bytes: int) -> None:
        self.log.config = replace(CONFIG, retention_bytes=retention_bytes)
        self.log.delete_old_segments()
        self.log.config = CONFIG
        self._drop_below_start()

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log.log_start_offset, self.log.high_watermark))
        self.log.maybe_increment_log_start_offset(offset, CLIENT_RECORD_DELETION)
        self.log.delete_old_segments()
        self._drop_below_start()

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log.log_start_offset, self.end))
        if offset <= self.log.log_start_offset:
            # Nothing readable is kept: the log starts afresh at `offset`.
            self.log.truncate_to(offset)
            self.batches, self.end = [], offset
            return
        self.log.truncate_to(offset)
        # As in Kafka, the whole batch holding `offset` goes.
        removed = [b for b in self.batches if b[0] + len(b[1]) - 1 >= offset]
        self.batches = self.batches[: len(self.batches) - len(removed)]
        if removed:
            self.end = removed[0][0]

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        start, hw, recovery = (
            self.log.log_start_offset,
            self.log.high_watermark,
            self.log.recovery_point,
        )
        if clean:
            self.log.flush()
            recovery = self.log.recovery_point
        self.log.close()
        self.log = Log(
            self.dir,
            TP,
            CONFIG,
            TOPIC_ID,
            recovery_point=recovery if clean else 0,
            log_start_offset=start,
            high_watermark=hw,
            had_clean_shutdown=clean,
        )

    def _drop_below_start(self) -> None:
        start = self.log.log_start_offset
        self.batches = [b for b in self.batches if b[0] + len(b[1]) > start]

    @invariant()
    def reads_equal_model(self) -> None:
        start, end = self.log.log_start_offset, self.log.log_end_offset
        assert end == self.end
        assert start <= self.log.high_watermark <= end
        expected = [
            (base + i, v)
            for base, values in self.batches
            for i, v in enumerate(values)
            if base + i >= start
        ]
        got: list[tuple[int, bytes | None]] = []
        offset = start
        while offset < end:
            data = self.log.read(offset, 700, end, min_one_batch=True)
            assert data.records is not None, f"nothing read at {offset} below end {end}"
            records = [
                (r.offset, r.value)
                for r in decode_records(data.records.read())
                if r.offset >= offset
            ]
            assert records, f"no whole batch read at {offset}"
            got += records
            offset = records[-1][0] + 1
        assert got == expected

    @invariant()
    def epochs_start_at_or_after_log_start(self) -> None:
        entries = self.log.leader_epoch_cache.entries
        assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(entries))
        if entries and self.batches:
            assert entries[0][1] <= self.log.log_start_offset or entries[0][1] <= self.batches[0][0]


TestLog = LogMachine.TestCase
TestLog.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
