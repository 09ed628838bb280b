"""OffsetIndex and TimeIndex lookups against a brute-force model, across reopen."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tierbroker.storage.indexes import OffsetIndex, TimeIndex

BASE = 1000

# Strictly increasing (offset delta, position delta) steps.
steps = st.lists(st.tuples(st.integers(1, 50), st.integers(1, 5000)), max_size=60)
probes = st.lists(st.integers(BASE - 10, BASE + 4000), max_size=30)


def model_offset_lookup(entries: list[tuple[int, int]], target: int) -> tuple[int, int]:
    below = [e for e in entries if e[0] <= target]
    return below[-1] if below else (BASE, 0)


@settings(max_examples=150, deadline=None)
@given(steps, probes)
def test_offset_index_matches_model(steps: list[tuple[int, int]], probes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "00000000000000001000.index"
        index = OffsetIndex(path, BASE, 10_000)
        entries, offset, position = [], BASE, 0
        for offset_step, position_step in steps:
            index.append(offset, position)
            entries.append((offset, position))
            offset += offset_step
            position += position_step
        index.close()
        reopened = OffsetIndex(path, BASE, 10_000)
        try:
            assert reopened.entries == len(entries)
            if entries:
                assert reopened.last_entry == entries[-1]
            for target in probes:
                assert reopened.lookup(target) == model_offset_lookup(entries, target)
            if entries:
                cut = entries[len(entries) // 2][0]
                reopened.truncate_to(cut)
                kept = [e for e in entries if e[0] < cut]
                for target in probes:
                    assert reopened.lookup(target) == model_offset_lookup(kept, target)
        finally:
            reopened.close()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 100), st.integers(1, 20)), max_size=60), probes)
def test_time_index_matches_model(steps: list[tuple[int, int]], probes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "00000000000000001000.timeindex"
        index = TimeIndex(path, BASE, 12_000)
        entries: list[tuple[int, int]] = []
        timestamp, offset = 0, BASE
        for ts_step, offset_step in steps:
            timestamp += ts_step
            offset += offset_step
            index.maybe_append(timestamp, offset)
            # The model keeps an entry only when both timestamp and offset grow.
            if not entries or (timestamp > entries[-1][0] and offset > entries[-1][1]):
                entries.append((timestamp, offset))
        index.close()
        reopened = TimeIndex(path, BASE, 12_000)
        try:
            for target in probes:
                below = [e for e in entries if e[0] <= target]
                assert reopened.lookup(target) == (below[-1] if below else (-1, BASE))
        finally:
            reopened.close()


def test_torn_entry_is_dropped_on_open(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0, 1000)
    index.append(0, 0)
    index.append(5, 100)
    index.close()
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00")  # a torn third entry
    reopened = OffsetIndex(path, 0, 1000)
    assert reopened.last_entry == (5, 100)
    assert reopened.lookup(1000) == (5, 100) and path.stat().st_size == 16
    reopened.close()


def test_a_torn_first_entry_is_dropped_before_appends(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    path.write_bytes(b"\x00\x00\x07")
    index = OffsetIndex(path, 0, 1000)
    index.append(3, 60)
    index.close()
    assert OffsetIndex(path, 0, 1000).lookup(10) == (3, 60)
