"""glibc's malloc as `serve` sets it, measured in fresh processes (never this one)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tierbroker.broker.server.memory import MALLOC_VARIABLES, SETTINGS, is_glibc

pytestmark = pytest.mark.skipif(not is_glibc(), reason="mallopt is glibc's")

MIB = 1 << 20
SETUP = """
import ctypes, re, resource, sys
from concurrent.futures import ThreadPoolExecutor
from tierbroker.broker.server.memory import reuse_large_buffers
PR_SET_THP_DISABLE = 41  # 4 KiB pages, so faults count pages whatever the THP setting
assert ctypes.CDLL(None).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
if sys.argv[1] == "tuned":
    assert reuse_large_buffers()

def rss_mib():
    status = open("/proc/self/status").read()
    return int(re.search(r"VmRSS:\\s+(\\d+)", status).group(1)) // 1024
"""

CHURN = """
sizes = [(4 << 20) + (i * 997 * 4096) % (8 << 20) for i in range(90)]  # 4 to 12 MiB
for rounds in range(2):  # the first round grows the heap; the second is measured
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(0, 90, 3):  # three responses at a time, each written in full, then freed
        buffers = [b"\\1" * size for size in sizes[i : i + 3]]
        del buffers
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

THREADS = """
def read_parts(i):  # a remote-read thread: an 8 MiB part and the slice it answers with
    for k in range(8):
        part = b"\\1" * ((8 << 20) - (i * 7919 * k) % 100_000)
        answer = part[100:]
        del part, answer
before = rss_mib()
with ThreadPoolExecutor(10) as pool:
    list(pool.map(read_parts, range(40)))
print(rss_mib() - before)
"""


def run(script: str, mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in (*MALLOC_VARIABLES, "GLIBC_TUNABLES")}
    done = subprocess.run(
        [sys.executable, "-c", SETUP + script, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return int(done.stdout)


def test_large_buffers_come_from_the_heap_without_faulting_pages_in() -> None:
    untuned, tuned = run(CHURN, "default"), run(CHURN, "tuned")
    assert untuned > 10_000  # glibc's default: buffers fault their pages in again and again
    assert tuned < untuned // 20


def test_threads_share_one_arena_so_free_memory_kept_is_bounded() -> None:
    # Ten threads of 8 MiB buffers would keep ten arenas' worth of free heap.
    trim_mib = SETTINGS["M_TRIM_THRESHOLD"][1] // MIB
    assert run(THREADS, "tuned") < trim_mib + 32


@pytest.mark.parametrize(
    ("name", "value", "applied"),
    [
        ("MALLOC_ARENA_MAX", "4", False),
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576", False),
        ("GLIBC_TUNABLES", "glibc.pthread.rseq=0", True),  # not about malloc
        ("MALLOC_PERTURB_", "85", True),  # a debugging aid, not a setting of ours
    ],
)
def test_the_environments_malloc_settings_win(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, applied: bool
) -> None:
    monkeypatch.setenv(name, value)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tierbroker.broker.server.memory import reuse_large_buffers as r; print(r())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == str(applied)
