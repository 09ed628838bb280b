"""Large buffers reused from the heap (glibc), measured in page faults of a fresh process."""

from __future__ import annotations

import subprocess
import sys

from broker.memory import reuse_large_buffers

CHURN = """
import resource, sys
from broker.memory import reuse_large_buffers
if sys.argv[1] == "tuned":
    assert reuse_large_buffers()
sizes = [(4 << 20) + (i * 997 * 4096) % (8 << 20) for i in range(90)]  # 4 to 12 MiB
for rounds in range(2):  # the first round grows the heap; the second is measured
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(0, 90, 3):  # three responses at a time, each written in full, then freed
        buffers = [bytes(size) for size in sizes[i : i + 3]]
        del buffers
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    run = subprocess.run(
        [sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True
    )
    return int(run.stdout)


def test_large_buffers_come_from_the_heap_without_faulting_pages_in() -> None:
    assert reuse_large_buffers()
    untuned, tuned = page_faults("default"), page_faults("tuned")
    assert untuned > 10_000  # glibc's default: buffers fault their pages in again and again
    assert tuned < untuned // 20
