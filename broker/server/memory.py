"""Large buffers kept in the heap, so a multi-MiB buffer does not fault in fresh pages.

glibc's malloc maps each buffer above its threshold (128 KiB, raised as such
buffers are freed) afresh and trims the heap top above twice that, so produce
requests, remote reads and their responses, which come and go at several MiB
each, cost a page fault per 4 KiB: more CPU than the copies themselves.

The threshold and trim limit apply per arena, and glibc gives threads arenas of
their own; with one arena, the free memory kept at the top of the heap is bounded
by the trim limit. Python holds the GIL across most allocations, so a single
arena costs little contention.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

MIB = 1 << 20
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
SETTINGS = {
    "M_MMAP_THRESHOLD": (M_MMAP_THRESHOLD, 32 * MIB),  # glibc's ceiling for its own
    "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 64 * MIB),
    "M_ARENA_MAX": (M_ARENA_MAX, 1),
}

# glibc's environment variables for the same settings; GLIBC_TUNABLES has glibc.malloc.*.
MALLOC_VARIABLES = (
    "MALLOC_ARENA_MAX",
    "MALLOC_ARENA_TEST",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_TRIM_THRESHOLD_",
)


def is_glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


def tuned_by_environment() -> bool:
    """glibc reads its malloc settings from the environment at start: the user's choice wins."""
    return "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "") or any(
        name in os.environ for name in MALLOC_VARIABLES
    )


def reuse_large_buffers() -> bool:
    """Serve buffers below 32 MiB from one heap arena and keep up to 64 MiB of it free.

    Changes nothing, and returns False, where the C library is not glibc or the
    environment already tunes malloc.
    """
    if not is_glibc():
        return False
    if tuned_by_environment():
        log.info("malloc is tuned by the environment; leaving it as it is")
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    for name, (param, value) in SETTINGS.items():
        if not mallopt(param, value):
            log.warning("mallopt refused %s=%d; the rest of glibc's defaults stay", name, value)
            return False
    log.info("malloc: %s", ", ".join(f"{name}={value}" for name, (_, value) in SETTINGS.items()))
    return True
