"""Would uvloop speed up the broker? The throughput workload on asyncio's loop and on uvloop.

    python -m benchmarks.broker_loop [--mib 100] [--sizes 1024,16384] [--rounds 2]

The broker (`tierbroker serve`, the shipped config) runs once per slot, on the
stock asyncio loop or with uvloop's event loop policy installed before the CLI
starts, in ABBA order (asyncio, uvloop, uvloop, asyncio per round) so drift hits
both alike. Each slot produces and consumes `benchmarks.workload`'s workload
(confluent-kafka, partition 0) once per value size. On uvloop the fetch path
reads segment bytes with `os.pread` instead of `loop.sendfile` (uvloop has none).

Reported per size and phase: MiB/s and the broker's CPU seconds per loop (sums
over rounds), and the ratio uvloop / asyncio. Needs uvloop (the `bench` extra).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks import workload
from benchmarks.targets import ROOT, Broker, free_port, spawn, stop

LAUNCH = """
import asyncio, sys
if sys.argv.pop(1) == "uvloop":
    import uvloop
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
from tierbroker.broker.cli.main import main
main()
"""
LOOPS = ("asyncio", "uvloop")


def start(loop: str, workdir: Path) -> Broker:
    port = free_port()
    settings = {
        "listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "log.dirs": str(workdir / "data"),
        "metrics.port": str(free_port()),
    }
    args = [sys.executable, "-c", LAUNCH, loop, "serve", "--config", "config/server.properties"]
    for key, value in settings.items():
        args += ["--override", f"{key}={value}"]
    return spawn(f"tierbroker-{loop}", args, port, workdir, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.broker_loop")
    parser.add_argument("--mib", type=int, default=100, help="MiB of values per size")
    parser.add_argument("--sizes", default="1024,16384", help="value sizes in bytes")
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds")
    args = parser.parse_args(argv)
    try:
        import uvloop  # noqa: F401
    except ImportError:
        raise SystemExit("this benchmark compares with uvloop: pip install uvloop") from None
    sizes = [int(s) for s in args.sizes.split(",")]
    # (size, phase, loop) -> [MiB, seconds, broker CPU seconds]
    totals: dict[tuple[int, str, str], list[float]] = {}
    for round_, loop in enumerate(["asyncio", "uvloop", "uvloop", "asyncio"] * args.rounds):
        workdir = Path(tempfile.mkdtemp(prefix=f"tierbroker-{loop}-"))
        try:
            broker = start(loop, workdir)
            try:
                for size in sizes:
                    topic = f"loop-{size}-{round_}"
                    count = args.mib * 1024 * 1024 // size
                    value = b"x" * size
                    workload.create_topic(broker.bootstrap, topic)
                    phases = {
                        "produce": workload.produce(
                            broker.bootstrap, topic, value, count, broker.cpu_seconds
                        ),
                        "consume": workload.consume(
                            broker.bootstrap, topic, count, size, broker.cpu_seconds
                        ),
                    }
                    for name, phase in phases.items():
                        total = totals.setdefault((size, name, loop), [0.0, 0.0, 0.0])
                        total[0] += phase.payload_bytes / (1024 * 1024)
                        total[1] += phase.seconds
                        total[2] += phase.broker_cpu_s or 0.0
                    print(
                        f"{loop:<8} {size:>6} B: produce {phases['produce'].mib_per_s:7.1f} "
                        f"MiB/s  consume {phases['consume'].mib_per_s:7.1f} MiB/s",
                        flush=True,
                    )
            finally:
                stop(broker)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    for size in sizes:
        for name in ("produce", "consume"):
            mib_s = {lp: totals[size, name, lp][0] / totals[size, name, lp][1] for lp in LOOPS}
            cpu = {lp: totals[size, name, lp][2] / totals[size, name, lp][0] for lp in LOOPS}
            print(
                f"{size:>6} B {name}: asyncio {mib_s['asyncio']:7.1f} MiB/s, uvloop "
                f"{mib_s['uvloop']:7.1f} MiB/s: uvloop / asyncio "
                f"{mib_s['uvloop'] / mib_s['asyncio']:.2f}x MiB/s, "
                f"{cpu['uvloop'] / cpu['asyncio']:.2f}x broker CPU per MiB",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
