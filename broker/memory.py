"""Large buffers kept in the heap, so a multi-MiB response does not fault in fresh pages.

glibc's malloc maps each buffer above its threshold (128 KiB, raised as such
buffers are freed) afresh and trims the heap top above twice that, so produce
requests, remote reads and their responses, which come and go at several MiB
each, cost a page fault per 4 KiB: more CPU than the copies themselves. Above the
trim threshold freed memory still goes back to the OS.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

MIB = 1 << 20
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * MIB  # glibc's own ceiling for its moving threshold
TRIM_THRESHOLD_BYTES = 128 * MIB


def reuse_large_buffers() -> bool:
    """Serve buffers below 32 MiB from the heap and keep up to 128 MiB of it free.

    Returns False, and changes nothing, where the C library is not glibc.
    """
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    done = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and libc.mallopt(
        M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES
    )
    if not done:
        log.warning("mallopt refused the large-buffer settings; keeping glibc's defaults")
    return bool(done)
