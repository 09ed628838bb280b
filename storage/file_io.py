"""Whole writes: a write(2) may store fewer bytes than asked, so appends loop until done.

A short count is not an error in itself (a signal, a nearly full disk); the next
write of the rest then stores more or raises the OSError (ENOSPC, EIO) that says why.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path


def write_fully(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of `data` at the file's current position, or raise the OSError that stopped it.

    On an error, an unknown prefix of `data` may be in the file: the caller cuts it off.
    """
    written = os.write(fd, data)
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if written < size:
        view = memoryview(data).cast("B")
        while written < size:
            stored = os.write(fd, view[written:])
            if stored == 0:  # not seen on Linux for a regular file; would loop forever
                raise OSError(errno.EIO, f"write of {size - written} bytes stored none")
            written += stored


def write_file(path: Path, data: bytes, *, sync: bool) -> None:
    """Create or overwrite `path` with all of `data` (fsynced if `sync`), or raise the OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_fully(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: Path, write: Callable[[Path], None]) -> None:
    """Write a temp file with `write(tmp)` (which fsyncs it), put it in place of `path`
    and fsync the directory: a crash leaves the old file or the new one whole. On an
    OSError the old file stays and no temp file is left."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def fsync_if_exists(path: Path) -> None:
    """fsync the file at `path`; nothing if it is not there (never written, or deleted)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
