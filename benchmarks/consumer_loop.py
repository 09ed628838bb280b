"""Does uvloop speed up `TieredConsumer`? The same backfills on asyncio's loop and uvloop's.

    python -m benchmarks.consumer_loop [--mib 64] [--rounds 2]

One tierbroker tiers a 2-partition topic to LocalFs (as `benchmarks.pipeline`
does), then the whole remote range is read with `TieredConsumer` in REMOTE_ONLY
(the object store, decoded in the consumer's thread pool) and in KAFKA_ONLY
(aiokafka through the broker), each on the stock asyncio loop and on uvloop, in
ABBA order (asyncio, uvloop, uvloop, asyncio per round) so drift hits both alike,
after one untimed read per mode that warms the page cache and the imports.

Reported per mode: MB/s and the reader's CPU seconds for each loop (sums over
rounds), and the ratio uvloop / asyncio. Needs uvloop (`pip install uvloop`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from benchmarks.pipeline import OVERRIDES, backfill, fill
from benchmarks.targets import free_port, start_tierbroker, stop

Runner = Callable[[Coroutine[Any, Any, int]], int]


def runners() -> dict[str, Runner]:
    try:
        import uvloop
    except ImportError:
        raise SystemExit("this benchmark compares with uvloop: pip install uvloop") from None
    return {"asyncio": asyncio.run, "uvloop": uvloop.run}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.consumer_loop")
    parser.add_argument("--mib", type=int, default=64, help="MiB of values produced")
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds per mode")
    args = parser.parse_args(argv)
    loops = runners()
    order = ["asyncio", "uvloop", "uvloop", "asyncio"] * args.rounds

    with tempfile.TemporaryDirectory(prefix="tierbroker-loops-") as tmp:
        workdir = Path(tmp)
        metrics_port = str(free_port())
        broker = start_tierbroker(workdir, {**OVERRIDES, "metrics.port": metrics_port})
        try:
            ends = fill(broker, metrics_port, args.mib, args.value_size)
            storage = (workdir / "data" / "remote").as_uri()
            for mode in ("REMOTE_ONLY", "KAFKA_ONLY"):
                totals = {name: [0.0, 0.0, 0.0] for name in loops}  # MB, seconds, CPU s
                asyncio.run(backfill(broker, storage, mode, ends))  # warm-up, not counted
                for name in order:
                    cpu, started = time.process_time(), time.monotonic()
                    read = loops[name](backfill(broker, storage, mode, ends))
                    seconds, cpu_s = time.monotonic() - started, time.process_time() - cpu
                    for i, value in enumerate((read / 1e6, seconds, cpu_s)):
                        totals[name][i] += value
                    print(
                        f"{mode:<12} {name:<8} {read / 1e6 / seconds:8.1f} MB/s  "
                        f"reader {cpu_s:6.2f} CPU s",
                        flush=True,
                    )
                rate = {n: mb / s for n, (mb, s, _) in totals.items()}
                cpu = {n: c / mb for n, (mb, _, c) in totals.items()}
                print(
                    f"{mode}: uvloop / asyncio {rate['uvloop'] / rate['asyncio']:.2f}x MB/s, "
                    f"{cpu['uvloop'] / cpu['asyncio']:.2f}x reader CPU per MB",
                    flush=True,
                )
        finally:
            stop(broker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
