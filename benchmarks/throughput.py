"""Throughput: one produce/consume workload against tierbroker, Tansu, Apache Kafka and the
machine's ceiling.

    .venv/bin/python -m benchmarks.throughput [--messages N | --mib M] [--sizes 1024,16384]
                                   [--targets tierbroker,tansu,apache-kafka,ceiling] [--json OUT]

Prints, for each value size, MiB/s, msgs/s and broker CPU seconds for each phase, the
ratios of tierbroker to each other target, and each broker's startup time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import confluent_kafka

from benchmarks import ceiling, workload
from benchmarks.phase import Phase
from benchmarks.targets import Broker, TargetUnavailable, api_versions, running

BROKERS = ("tierbroker", "tansu", "apache-kafka")
ALL_TARGETS = (*BROKERS, "ceiling")
PHASES = ("produce", "consume")
API_NAMES = {0: "Produce", 1: "Fetch", 3: "Metadata", 18: "ApiVersions", 19: "CreateTopics"}


def message_count(args: argparse.Namespace, size: int) -> int:
    return int(args.messages) if args.messages else max(1, args.mib * 1024 * 1024 // size)


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def run_broker(name: str, args: argparse.Namespace, values: dict[int, bytes]) -> dict[str, Any]:
    """Start broker `name` once and run every value size against it; never raises."""
    result: dict[str, Any] = {"status": "ok", "sizes": {}}
    try:
        with running(name) as broker:
            result["startup_s"] = broker.startup_s
            result["api_versions"] = api_versions(broker.port)
            print(f"{name}: up in {broker.startup_s:.3f} s on {broker.bootstrap}")
            for size, value in values.items():
                result["sizes"][size] = run_size(name, broker, value, args)
                if broker.process.poll() is not None:
                    code = broker.process.returncode
                    raise RuntimeError(f"{name} exited with {code}:\n{broker.log_tail()}")
            result["peak_rss_mib"] = broker.peak_rss_mib()
            result["rss_mib"] = broker.rss_mib()
    except TargetUnavailable as e:
        result.update(status="skipped", reason=str(e))
        print(f"{name}: skipped: {e}")
    except Exception as e:
        result.update(status="failed", reason=describe(e))
        print(f"{name}: failed: {describe(e)}")
    return result


def run_size(name: str, broker: Broker, value: bytes, args: argparse.Namespace) -> dict[str, Any]:
    """`args.repeat` rounds of produce-then-consume, each on a fresh topic; the median counts."""
    size = len(value)
    count = message_count(args, size)
    produces: list[Phase] = []
    consumes: list[Phase] = []
    bootstrap, cpu = broker.bootstrap, broker.cpu_seconds
    try:
        for round_ in range(args.repeat):
            topic = f"bench-{size}-{round_}"
            created_by = workload.create_topic(bootstrap, topic)
            produces.append(workload.produce(bootstrap, topic, value, count, cpu))
            consumes.append(workload.consume(bootstrap, topic, count, size, cpu))
            print(f"  {name} {size} B: produce {rate(produces[-1])}  consume {rate(consumes[-1])}")
    except Exception as e:
        print(f"  {name} {size} B: failed: {describe(e)}")
        return {"error": describe(e)}
    return {"produce": median(produces), "consume": median(consumes), "created_by": created_by}


def median(runs: list[Phase]) -> Phase:
    """The run with the median time (the slower middle one for an even count), with all times."""
    chosen = sorted(runs, key=lambda phase: phase.seconds)[len(runs) // 2]
    chosen.extra["all_runs_s"] = [phase.seconds for phase in runs]
    return chosen


def run_ceiling(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    """The ceiling per size, in frames the size of the Produce requests the brokers got."""
    result: dict[str, Any] = {"status": "ok", "sizes": {}}
    for size in args.sizes:
        measured = [phase_of(results, b, size, "produce") for b in BROKERS]
        request_sizes = [p.extra["avg_request_bytes"] for p in measured if p and p.extra]
        frame_size = request_sizes[0] if request_sizes else workload.PRODUCER_SETTINGS["batch.size"]
        count = message_count(args, size)
        try:
            produce, consume = ceiling.measure(count * size, count, frame_size, args.repeat)
        except Exception as e:
            result["sizes"][size] = {"error": describe(e)}
            print(f"  ceiling {size} B: failed: {describe(e)}")
            continue
        print(f"  ceiling {size} B: produce {rate(produce)} in {frame_size} B frames")
        print(f"  ceiling {size} B: consume {rate(consume)}")
        result["sizes"][size] = {"produce": produce, "consume": consume}
    return result


# --- report ---


def rate(phase: Phase) -> str:
    return f"{phase.mib_per_s:8.1f} MiB/s {phase.msgs_per_s:10.0f} msgs/s"


def phase_of(results: dict[str, Any], target: str, size: int, phase: str) -> Phase | None:
    found = results.get(target, {}).get("sizes", {}).get(size, {}).get(phase)
    return found if isinstance(found, Phase) else None


def status_note(results: dict[str, Any], target: str, size: int) -> str:
    target_result = results.get(target)
    if target_result is None:
        return "not run"
    if target_result["status"] != "ok":
        note = f"{target_result['status']}: {target_result['reason']}"
    else:
        note = str(target_result["sizes"].get(size, {}).get("error", "no result"))
    return note.splitlines()[0]


def ratio(a: Phase | None, b: Phase | None) -> str:
    return f"{a.mib_per_s / b.mib_per_s:.2f}x" if a and b else "n/a"


def cells(phase: Phase | None) -> str:
    if phase is None:
        return f"{'-':>28}"
    cpu = "-" if phase.broker_cpu_s is None else f"{phase.broker_cpu_s:.2f}"
    return f"{phase.mib_per_s:9.1f}{phase.msgs_per_s:11.0f}{cpu:>8}"


def startup_line(name: str, result: dict[str, Any]) -> str:
    versions = result.get("api_versions", {})
    known = sorted(key for key in versions if key in API_NAMES)
    apis = [f"{API_NAMES[key]} v{versions[key][0]}-{versions[key][1]}" for key in known]
    startup = f"{result['startup_s']:.3f} s"
    rss = (
        f"; RSS peak {result['peak_rss_mib']:.0f} MiB, after {result['rss_mib']:.0f} MiB"
        if "peak_rss_mib" in result
        else ""
    )
    return f"{name:<10} startup (spawn -> ApiVersions answered) {startup}{rss}; {', '.join(apis)}"


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, confluent-kafka "
        f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})",
        "producer: acks=1 linger.ms=5 batch.size=1000000 compression=none, keys None",
        "consumer: assign(partition 0, offset 0), fetch.max.bytes=50MiB, "
        "max.partition.fetch.bytes=16MiB, fetch.queue.backoff.ms=10",
    ]
    lines += [startup_line(n, r) for n, r in results.items() if "startup_s" in r]
    for size in args.sizes:
        count = message_count(args, size)
        lines += [
            "",
            f"{size} B values x {count} ({count * size / 2**20:.1f} MiB)",
            f"{'':<20}{'produce':>28}   {'consume':>28}",
            (f"{'':<20}" + f"{'MiB/s':>9}{'msgs/s':>11}{'cpu s':>8}   " * 2).rstrip(),
        ]
        for target in (t for t in ALL_TARGETS if t in args.targets):
            produce, consume = (phase_of(results, target, size, p) for p in PHASES)
            if produce or consume:
                lines.append(f"{target:<20}{cells(produce)}   {cells(consume)}")
            else:
                lines.append(f"{target:<20}{status_note(results, target, size)}")
        mine = [phase_of(results, "tierbroker", size, p) for p in PHASES]
        others = [t for t in ALL_TARGETS[1:] if {"tierbroker", t} <= set(args.targets)]
        for other in others:
            theirs = [phase_of(results, other, size, p) for p in PHASES]
            produce_ratio, consume_ratio = ratio(mine[0], theirs[0]), ratio(mine[1], theirs[1])
            lines.append(f"{'tierbroker/' + other:<20}{produce_ratio:>9}{consume_ratio:>31}")
    lines += ["", "cpu s: CPU seconds (user+sys) of the broker / ceiling server during the phase"]
    return "\n".join(lines)


def to_json(value: Any) -> Any:
    if isinstance(value, Phase):
        return {**asdict(value), "mib_per_s": value.mib_per_s, "msgs_per_s": value.msgs_per_s}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def write_json(path: Path, results: dict[str, Any], args: argparse.Namespace) -> None:
    settings = {
        "sizes": args.sizes,
        "messages": {size: message_count(args, size) for size in args.sizes},
        "producer": workload.PRODUCER_SETTINGS,
        "consumer": workload.CONSUMER_SETTINGS,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "librdkafka": confluent_kafka.libversion()[0],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json({"settings": settings, "results": results}), indent=2))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput")
    parser.add_argument("--messages", type=int, help="messages per value size")
    parser.add_argument("--mib", type=int, default=200, help="else MiB of values per size")
    parser.add_argument("--sizes", default="1024,16384", help="value sizes in bytes")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per size (median)")
    parser.add_argument("--targets", default=",".join(ALL_TARGETS), help="subset to run")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.targets = [t for t in args.targets.split(",") if t]
    unknown = set(args.targets) - set(ALL_TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {ALL_TARGETS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C does, so the `finally`s stop every subprocess we started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    started = time.perf_counter()
    values = {size: os.urandom(size) for size in args.sizes}  # generated once, reused everywhere
    results: dict[str, Any] = {}
    for name in BROKERS:
        if name in args.targets:
            results[name] = run_broker(name, args, values)
    if "ceiling" in args.targets:
        results["ceiling"] = run_ceiling(args, results)
    print("\n" + report(results, args))
    print(f"\n(whole run: {time.perf_counter() - started:.1f} s)")
    if args.json:
        write_json(args.json, results, args)
        print(f"wrote {args.json}")
    failed = [
        name
        for name, r in results.items()
        if r["status"] == "failed" or any("error" in s for s in r["sizes"].values())
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
