"""`tierbroker serve` with every event-loop callback timed, for benchmarks that measure
how long a broker process's own work holds its loop.

    python -m benchmarks.probed_serve OUT serve --override ...

Each callback's CPU time (of the loop's thread: what the broker's code itself costs,
garbage collections included) and wall time (also what the machine did meanwhile) are
measured, and so is each garbage collection. Every 100 ms a line `<unix time> <longest
CPU ms> <longest wall ms> <longest collection ms> <what>` is appended to OUT, `what`
naming the callback that took the longest CPU time.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from pathlib import Path

from tierbroker.broker.cli.main import main as cli

WINDOW_S = 0.1


def describe(handle: asyncio.Handle) -> str:
    """The task a callback steps (its name and coroutine), else the callback itself."""
    callback = handle._callback  # type: ignore[attr-defined]
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        return f"task {task.get_name()} {task.get_coro().__qualname__}"  # type: ignore[union-attr]
    return repr(handle)[:160].replace("\n", " ")


class CallbackTimer:
    """The longest callback of the window, by CPU and by wall time."""

    def __init__(self, out: Path) -> None:
        self.lines = out.open("a", buffering=1)
        self.longest_cpu_s = 0.0
        self.longest_wall_s = 0.0
        self.longest_what = ""
        self.longest_collection_s = 0.0
        self._collection_started = 0.0
        self.window_ends = time.monotonic() + WINDOW_S
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._collection_started = time.perf_counter()
        else:
            took = time.perf_counter() - self._collection_started
            self.longest_collection_s = max(self.longest_collection_s, took)

    def record(self, handle: asyncio.Handle, cpu_s: float, wall_s: float) -> None:
        if cpu_s > self.longest_cpu_s:
            self.longest_cpu_s = cpu_s
            self.longest_what = describe(handle)
        self.longest_wall_s = max(self.longest_wall_s, wall_s)
        if time.monotonic() >= self.window_ends:
            self.lines.write(
                f"{time.time():.3f} {self.longest_cpu_s * 1000:.2f} "
                f"{self.longest_wall_s * 1000:.2f} {self.longest_collection_s * 1000:.2f} "
                f"{self.longest_what}\n"
            )
            self.longest_cpu_s = self.longest_wall_s = self.longest_collection_s = 0.0
            self.window_ends = time.monotonic() + WINDOW_S


def time_callbacks(timer: CallbackTimer) -> None:
    """Wrap `Handle._run` (which runs every callback and task step) for the loop's thread."""
    run = asyncio.events.Handle._run
    loop_thread = threading.get_ident()

    def timed_run(handle: asyncio.Handle) -> None:
        if threading.get_ident() != loop_thread:
            return run(handle)
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return run(handle)
        finally:
            timer.record(handle, time.thread_time() - cpu, time.perf_counter() - wall)

    asyncio.events.Handle._run = timed_run  # type: ignore[assignment]


def main() -> None:
    out = Path(sys.argv[1])
    sys.argv = ["tierbroker", *sys.argv[2:]]
    time_callbacks(CallbackTimer(out))
    cli.main()


if __name__ == "__main__":
    main()
