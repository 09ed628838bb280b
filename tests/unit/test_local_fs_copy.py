"""LocalFs's segment copy around the page cache: exact bytes at every size, with or
without O_DIRECT."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import crc32c
import pytest

from tierbroker.storage.remote.local_fs import COPY_CHUNK, DIRECT_ALIGNMENT, copy_around_page_cache


@contextmanager
def opened(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


SIZES = [
    0,
    1,
    DIRECT_ALIGNMENT - 1,
    DIRECT_ALIGNMENT,
    COPY_CHUNK,
    COPY_CHUNK + 1,
    3 * COPY_CHUNK + 123,
]


@pytest.mark.parametrize("size", SIZES)
def test_the_copy_has_the_source_bytes_and_size(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    (tmp_path / "source").write_bytes(data)
    with opened(tmp_path / "source") as fd:
        assert copy_around_page_cache(fd, tmp_path / "target") == (size, crc32c.crc32c(data))
    assert (tmp_path / "target").read_bytes() == data


def test_a_file_system_refusing_o_direct_gets_the_same_copy_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open
    refused = []

    def no_direct(path: Path, flags: int, mode: int = 0o777) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            refused.append(path)
            raise OSError(errno.EINVAL, "O_DIRECT not supported")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", no_direct)
    data = os.urandom(2 * COPY_CHUNK + 5)
    (tmp_path / "source").write_bytes(data)
    with opened(tmp_path / "source") as fd:
        assert copy_around_page_cache(fd, tmp_path / "target")[0] == len(data)
    assert (tmp_path / "target").read_bytes() == data
    assert refused == [tmp_path / "target"]


def test_a_copy_into_a_missing_directory_fails(tmp_path: Path) -> None:
    (tmp_path / "source").write_bytes(b"x")
    with opened(tmp_path / "source") as fd, pytest.raises(FileNotFoundError):
        copy_around_page_cache(fd, tmp_path / "missing" / "target")


def test_a_short_write_fails_the_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def one_block(fd: int, data: memoryview) -> int:
        return real_write(fd, data[:DIRECT_ALIGNMENT])

    monkeypatch.setattr(os, "write", one_block)
    (tmp_path / "source").write_bytes(os.urandom(COPY_CHUNK))
    with opened(tmp_path / "source") as fd, pytest.raises(OSError, match="short write"):
        copy_around_page_cache(fd, tmp_path / "target")
