"""Consumer groups: rebalance time and OffsetCommit rate, tierbroker vs Tansu.

    .venv/bin/python -m benchmarks.groups [--partitions 60] [--members 3] [--commits 20000]
        [--repeat 3] [--strategies range,cooperative-sticky,range+static] [--json OUT]

Per broker, one topic with a few messages in every partition; each round uses a fresh group
id. Rebalance: N consumers in N threads subscribe() at once; timed until the on_assign/on_revoke
callbacks show every partition owned by exactly one member (every member owning some), and until
every member has received a message. Commit: one assign()ed consumer commits partition 0 N times,
synchronously, or asynchronously followed by one synchronous commit. Broker CPU from /proc.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from benchmarks.targets import Broker, start_tansu, stop
from benchmarks.targets import start_tierbroker as targets_start_tierbroker

BROKERS = ("tierbroker", "tansu")
GROUP_SETTINGS: dict[str, Any] = {  # enable.auto.commit off: no commits in the rebalance phase
    "session.timeout.ms": 10_000, "heartbeat.interval.ms": 1_000,
    "auto.offset.reset": "earliest", "enable.auto.commit": False,
}  # fmt: skip
INITIAL_DELAY = {
    "tierbroker": "group.initial.rebalance.delay.ms=0 (passed as --override)",
    "tansu": "none to set; it holds every JoinGroup >= session.timeout.ms/2 (in 1 s steps) "
    "and, with group.instance.id, every SyncGroup >= 3 s",
}
ROUND_TIMEOUT_S = 90.0


def start_tierbroker(workdir: Path) -> Broker:
    """As benchmarks.targets starts it, plus an explicit initial rebalance delay of 0."""
    return targets_start_tierbroker(workdir, {"group.initial.rebalance.delay.ms": "0"})


@contextmanager
def running(name: str) -> Iterator[Broker]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-groups-{name}-"))
    try:
        broker = (start_tierbroker if name == "tierbroker" else start_tansu)(workdir)
        try:
            yield broker
        finally:
            stop(broker)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def setup_topic(bootstrap: str, topic: str, partitions: int, per_partition: int = 3) -> None:
    """Create the topic, wait until metadata shows every partition with a leader, fill it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while True:
        found = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if len(found) == partitions and all(p.leader >= 0 for p in found.values()):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: {len(found)} of {partitions} partitions after 30 s")
        time.sleep(0.05)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, b"v%d" % i, partition=p)
    if producer.flush(30):
        raise RuntimeError(f"{topic}: produce did not finish")


class Round:
    """One rebalance round: what the members have seen, in seconds after they were told to go."""

    def __init__(self, members: int, partitions: int) -> None:
        self.partitions, self.lock = partitions, threading.Lock()
        self.go, self.halt, self.done = threading.Event(), threading.Event(), threading.Event()
        self.t0 = 0.0
        self.owned: list[set[int]] = [set() for _ in range(members)]
        self.first_message: list[float | None] = [None] * members
        self.assigned_at: float | None = None  # first full, disjoint, all-member assignment
        self.assign_calls = 0
        self.errors: list[str] = []

    def change(self, i: int, added: list[Any], removed: list[Any]) -> None:
        with self.lock:
            self.assign_calls += bool(added)
            self.owned[i] |= {tp.partition for tp in added}
            self.owned[i] -= {tp.partition for tp in removed}
            total, union = sum(len(s) for s in self.owned), set().union(*self.owned)
            full = all(self.owned) and total == len(union) == self.partitions
            if full and self.assigned_at is None:
                self.assigned_at = time.perf_counter() - self.t0
            self._check()

    def message(self, i: int) -> None:
        with self.lock:
            if self.first_message[i] is None:
                self.first_message[i] = time.perf_counter() - self.t0
                self._check()

    def _check(self) -> None:
        if self.assigned_at is not None and None not in self.first_message:
            self.done.set()

    def member(self, i: int, consumer: Any, topic: str) -> None:
        """One group member's thread: subscribe() when told, poll until halted, close()."""
        try:
            self.go.wait()
            consumer.subscribe(
                [topic],
                on_assign=lambda _c, tps: self.change(i, tps, []),
                on_revoke=lambda _c, tps: self.change(i, [], tps),
                on_lost=lambda _c, tps: self.change(i, [], tps),
            )
            while not self.halt.is_set():
                msg = consumer.poll(0.05)
                if msg is not None and msg.error() is None:
                    self.message(i)
                elif msg is not None:
                    self.errors.append(f"member {i}: {msg.error()}")
        except Exception as e:
            self.errors.append(f"member {i}: {type(e).__name__}: {e}")
        finally:
            consumer.close()


def rebalance_round(
    broker: Broker, topic: str, args: argparse.Namespace, strategy: str, static: bool
) -> dict[str, float]:
    group = f"g-{uuid.uuid4().hex[:8]}"
    settings = {**GROUP_SETTINGS, "bootstrap.servers": broker.bootstrap, "group.id": group,
                "partition.assignment.strategy": strategy}  # fmt: skip
    consumers = [  # created (and connecting) before the clock starts
        Consumer({**settings, **({"group.instance.id": f"{group}-{i}"} if static else {})})
        for i in range(args.members)
    ]
    state = Round(args.members, args.partitions)
    threads = [threading.Thread(target=state.member, args=(i, c, topic), daemon=True)
               for i, c in enumerate(consumers)]  # fmt: skip
    for t in threads:
        t.start()
    cpu, state.t0 = broker.cpu_seconds(), time.perf_counter()
    state.go.set()
    finished = state.done.wait(ROUND_TIMEOUT_S)
    cpu = broker.cpu_seconds() - cpu
    state.halt.set()
    for t in threads:
        t.join(30)
    if not finished or state.assigned_at is None:
        sizes = [len(s) for s in state.owned]
        raise RuntimeError(
            f"not done in {ROUND_TIMEOUT_S:.0f} s: partitions per member {sizes}, "
            f"first messages {state.first_message}, errors {state.errors[:3]}"
        )
    first_message = max(t for t in state.first_message if t is not None)
    return {"assigned_s": state.assigned_at, "first_message_s": first_message,
            "assign_calls": state.assign_calls, "broker_cpu_s": cpu}  # fmt: skip


def commit_round(broker: Broker, topic: str, count: int, asynchronous: bool) -> dict[str, float]:
    """`count` OffsetCommits of partition 0 by one assign()ed consumer; async ends with a sync."""
    failures: list[str] = []
    callbacks = [0]

    def on_commit(err: Any, _tps: Any) -> None:
        callbacks[0] += 1
        if err is not None:
            failures.append(str(err))

    group = f"c-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({**GROUP_SETTINGS, "bootstrap.servers": broker.bootstrap,
                         "group.id": group, "on_commit": on_commit})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)  # coordinator
        cpu, started = broker.cpu_seconds(), time.perf_counter()
        for offset in range(1, count + 1):
            tps = [TopicPartition(topic, 0, offset)]
            if asynchronous and offset < count:
                consumer.commit(offsets=tps, asynchronous=True)
            else:
                consumer.commit(offsets=tps, asynchronous=False)
        seconds, cpu = time.perf_counter() - started, broker.cpu_seconds() - cpu
        deadline = time.monotonic() + 10
        while asynchronous and callbacks[0] < count - 1 and time.monotonic() < deadline:
            consumer.poll(0.05)  # collect the async results (not timed)
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()
    expected = count - 1 if asynchronous else 0  # sync commits get no on_commit callback
    if failures or committed != count or callbacks[0] != expected:
        raise RuntimeError(
            f"committed {committed} (expected {count}), async results "
            f"{callbacks[0]} (expected {expected}), errors {failures[:3]}"
        )
    return {"commits_per_s": count / seconds, "seconds": seconds, "broker_cpu_s": cpu}


def phases(args: argparse.Namespace) -> list[str]:
    return [f"rebalance {s}" for s in args.strategies] + ["commit sync", "commit async"]


def measure(broker: Broker, topic: str, phase: str, args: argparse.Namespace) -> dict[str, float]:
    """One round of `phase`: "commit sync|async" or "rebalance STRATEGY[+static]"."""
    kind, what = phase.split(" ", 1)
    if kind == "commit":
        return commit_round(broker, topic, args.commits, what == "async")
    strategy, _, extra = what.partition("+")  # "+static": members set group.instance.id
    return rebalance_round(broker, topic, args, strategy, extra == "static")


def run_broker(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every phase against one broker; a failing phase is recorded, never raised."""
    result: dict[str, Any] = {"phases": {}}
    try:
        with running(name) as broker:
            print(f"{name}: up in {broker.startup_s:.3f} s on {broker.bootstrap}")
            topic = f"groups-{args.partitions}"
            setup_topic(broker.bootstrap, topic, args.partitions)
            for phase in phases(args):
                try:
                    rounds = []
                    for _ in range(args.repeat):
                        rounds.append(measure(broker, topic, phase, args))
                        shown = ", ".join(f"{k} {v:.3f}" for k, v in rounds[-1].items())
                        print(f"  {name} {phase}: {shown}")
                    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
                    result["phases"][phase] = {**medians, "rounds": rounds}
                except Exception as e:
                    result["phases"][phase] = {"error": f"{type(e).__name__}: {e}"}
                    print(f"  {name} {phase}: failed: {e}")
                if broker.process.poll() is not None:
                    raise RuntimeError(f"{name} exited:\n{broker.log_tail()}")
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        print(f"{name}: failed: {result['error']}")
    return result


ROWS = {
    "rebalance": [("assigned_s", "subscribe -> full assignment, s"),
                  ("first_message_s", "subscribe -> every member's 1st msg, s"),
                  ("assign_calls", "on_assign calls (all members)"),
                  ("broker_cpu_s", "broker cpu s")],
    "commit": [("commits_per_s", "commits/s"), ("broker_cpu_s", "broker cpu s")],
}  # fmt: skip


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"confluent-kafka {confluent_kafka.__version__} (librdkafka "
        f"{confluent_kafka.libversion()[0]}); {args.partitions} partitions, {args.members} "
        f"members, {args.commits} commits, median of {args.repeat} rounds",
        "group settings: " + " ".join(f"{k}={v}" for k, v in GROUP_SETTINGS.items()),
        *(f"initial delay, {name}: {text}" for name, text in INITIAL_DELAY.items()),
        "",
        f"{'':<48}{'tierbroker':>12}{'tansu':>12}{'tb/tansu':>10}",
    ]
    failures: list[str] = []
    for phase in phases(args):
        lines.append(phase)
        found = [results[b].get("phases", {}).get(phase, {}) for b in BROKERS]
        for b, f in zip(BROKERS, found, strict=True):
            if "error" in f or "error" in results[b]:
                failures.append(f"FAILED {b} {phase}: {f.get('error') or results[b]['error']}")
        for key, label in ROWS[phase.split()[0]]:
            tb, ta = values = [f.get(key) for f in found]
            cells = "".join(f"{v:12.3f}" if v is not None else f"{'failed':>12}" for v in values)
            ratio = f"{tb / ta:9.2f}x" if tb is not None and ta else f"{'n/a':>10}"
            lines.append(f"  {label:<46}{cells}{ratio}")
    lines += ["", "tb/tansu: tierbroker / tansu (times: < 1 is faster; commits/s: > 1 is faster)"]
    return "\n".join(lines + failures)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.groups")
    parser.add_argument("--partitions", type=int, default=60)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--commits", type=int, default=20_000, help="OffsetCommits per round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per phase (median)")
    parser.add_argument("--strategies", default="range,cooperative-sticky,range+static",
                        help="assignment strategies; '+static' sets group.instance.id")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    args.strategies = [s for s in args.strategies.split(",") if s]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    started = time.perf_counter()
    results = {name: run_broker(name, args) for name in BROKERS}
    print("\n" + report(results, args))
    print(f"\n(whole run: {time.perf_counter() - started:.1f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {**vars(args), "json": str(args.json), "group": GROUP_SETTINGS}
        args.json.write_text(json.dumps({"settings": settings, "results": results}, indent=2))
        print(f"wrote {args.json}")
    phase_results = [p for r in results.values() for p in r["phases"].values()]
    failed = any("error" in r for r in results.values()) or any("error" in p for p in phase_results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
