"""How long a broker process taking over 1,000 partitions holds its event loop.

    python -m benchmarks.takeover_stalls [--partitions 1000] [--rounds 2] [--json OUT]

Three broker processes over a ZooKeeper; broker 0 starts first (the controller) and
leads every partition of one topic, replicated on brokers 0 and 1; broker 2 hosts
none and answers the benchmark's metadata polls. Broker 1 runs under
`benchmarks.probed_serve`, which times every callback of its loop. Broker 0 is then
stopped, by SIGTERM (a controlled shutdown moves every leader to broker 1) and, in a
second cluster, by SIGKILL (the controller, whichever broker wins the election, moves
them once broker 0's session expires). Measured on broker 1, from the signal until
broker 2's metadata names it leader of every partition, plus 2 s: the longest
callback in CPU time of its loop's thread (the broker's own work, garbage collections
included) and in wall time (also what the machine did meanwhile). Baseline, in the
same run: the same process in the 2 s before the signal, following the 1,000
partitions.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.replication import serving, zookeeper_member
from benchmarks.targets import free_port
from tests.zookeeper import ZooKeeperServer

TOPIC = "takeover"
SETTLED_S = 2.0  # watched after the takeover ends, and before the signal as the baseline


@dataclass(frozen=True)
class Window:
    """The longest callbacks of a time window of the probed broker's loop."""

    cpu_ms: float
    wall_ms: float
    what: str  # the callback with the longest CPU time


@dataclass(frozen=True)
class Round:
    signal: str
    takeover_s: float
    controller: int
    takeover: Window
    idle: Window


def longest(probe: Path, start: float, end: float) -> Window:
    rows = [line.split(" ", 4) for line in probe.read_text().splitlines()]
    inside = [(float(c), float(w), what) for t, c, w, _gc, what in rows if start <= float(t) <= end]
    cpu, _, what = max(inside)
    return Window(cpu, max(w for _, w, _ in inside), what)


def leaders(admin: AdminClient) -> list[int]:
    topic = admin.list_topics(TOPIC, timeout=10).topics[TOPIC]
    return [p.leader for p in topic.partitions.values()]


def wait_until(ready: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.25)


def one_round(sig: signal.Signals, partitions: int) -> Round:
    workdir = Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    probe = workdir / "probe.txt"
    zookeeper = ZooKeeperServer(workdir / "zk").start()
    ports = [free_port() for _ in range(3)]
    try:
        with ExitStack() as stack:
            processes = []
            for broker_id, port in enumerate(ports):
                settings = zookeeper_member(workdir, port, broker_id, zookeeper.connect, 3000)
                launcher = (
                    [sys.executable, "-m", "benchmarks.probed_serve", str(probe)]
                    if broker_id == 1
                    else None
                )
                processes.append(
                    stack.enter_context(serving(settings, workdir, f"b{broker_id}", launcher))
                )
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports[0]}", "log_level": 0})
            topic = NewTopic(TOPIC, partitions, replica_assignment=[[0, 1]] * partitions)
            admin.create_topics([topic])[TOPIC].result(120)
            watcher = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports[2]}", "log_level": 0})
            wait_until(lambda: set(leaders(watcher)) == {0}, "broker 0 to lead")
            time.sleep(SETTLED_S)  # the baseline: broker 1 following every partition
            signalled = time.time()
            processes[0].send_signal(sig)
            wait_until(lambda: set(leaders(watcher)) == {1}, "broker 1 to lead")
            took_over = time.time()
            time.sleep(SETTLED_S)
            controller = watcher.list_topics(timeout=10).controller_id
            return Round(
                sig.name,
                took_over - signalled,
                controller,
                longest(probe, signalled, took_over + SETTLED_S),
                longest(probe, signalled - SETTLED_S, signalled - 0.1),
            )
    finally:
        zookeeper.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rounds = [
        one_round(sig, args.partitions)
        for _ in range(args.rounds)
        for sig in (signal.SIGTERM, signal.SIGKILL)
    ]
    for r in rounds:
        print(
            f"{r.signal}: {args.partitions} partitions led by broker 1 in {r.takeover_s:.1f} s "
            f"(controller {r.controller}); longest callback {r.takeover.cpu_ms:.1f} ms CPU, "
            f"{r.takeover.wall_ms:.1f} ms wall (idle before: {r.idle.cpu_ms:.1f} ms CPU, "
            f"{r.idle.wall_ms:.1f} ms wall); longest was {r.takeover.what}"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rounds], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
