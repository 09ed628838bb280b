"""The pytest plugin's clusters: start-up and teardown, and what a function-scoped one adds
to each test.

Start and stop of `TierbrokerCluster` (what the fixtures run), round after round, each in
a fresh temp dir: one broker, and three brokers in racks a, b, c with tiering and
follower fetching; medians. Per-test overhead: pytest runs N tests that use the fixture
(and N that use none) in a subprocess, recording each test's setup and teardown time; the
median over all but the first, less the no-fixture tests', is what a test pays; the first
test also imports the broker. The baseline of the same run:
Tansu (a Rust broker) started as a process, to its first ApiVersions answer.

    python -m benchmarks.fixtures              # about a minute
    python -m benchmarks.fixtures --rounds 9 --tests 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import targets
from tierbroker.testing import TierbrokerCluster

SHAPES = {
    "1 broker": {},
    "3 brokers, racks, tiering": {
        "brokers": 3,
        "racks": ["a", "b", "c"],
        "tiering": True,
        "follower_fetching": True,
    },
}
FIXTURES = {
    "tierbroker": "def test_{i}(tierbroker):\n    assert tierbroker.bootstrap_servers\n",
    "tierbroker_cluster(3, racks, tiering)": (
        "def test_{i}(tierbroker_cluster):\n"
        "    c = tierbroker_cluster(3, racks=['a', 'b', 'c'], tiering=True)\n"
        "    assert c.bootstrap_servers\n"
    ),
    "no fixture": "def test_{i}():\n    assert True\n",
}


def start_stop_s(options: dict[str, object]) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        cluster = TierbrokerCluster(Path(directory), **options).start()  # type: ignore[arg-type]
        up = time.perf_counter()
        cluster.stop()
        return up - started, time.perf_counter() - up


RECORDER = """
import json

durations = []

def pytest_runtest_logreport(report):
    if report.when in ("setup", "teardown"):
        durations.append((report.nodeid, report.when, report.duration))

def pytest_sessionfinish(session):
    with open("durations.json", "w") as out:
        json.dump(durations, out)
"""


def fixture_s(body: str, tests: int) -> tuple[float, float]:
    """A pytest run of `tests` tests: the first test's setup and teardown (imports
    included), and the median of the others'."""
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "conftest.py").write_text(RECORDER)
        Path(directory, "test_generated.py").write_text(
            "\n\n".join(body.format(i=i) for i in range(tests))
        )
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
            cwd=directory,
            check=True,
            capture_output=True,
        )
        per_test: dict[str, float] = {}
        for nodeid, _when, duration in json.loads(Path(directory, "durations.json").read_text()):
            per_test[nodeid] = per_test.get(nodeid, 0.0) + duration
        first, *others = per_test.values()
        return first, statistics.median(others)


def tansu_startup_s() -> float:
    with targets.running("tansu") as broker:
        return broker.startup_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tests", type=int, default=20, help="tests per pytest run")
    args = parser.parse_args()
    start_stop_s({})  # imports and first-use costs out of the measured rounds
    starts: dict[str, list[float]] = {name: [] for name in SHAPES}
    stops: dict[str, list[float]] = {name: [] for name in SHAPES}
    firsts: dict[str, list[float]] = {name: [] for name in FIXTURES}
    others: dict[str, list[float]] = {name: [] for name in FIXTURES}
    tansu: list[float] = []
    for _ in range(args.rounds):
        for name, options in SHAPES.items():
            up, down = start_stop_s(options)
            starts[name].append(up)
            stops[name].append(down)
        for name, body in FIXTURES.items():
            first, rest = fixture_s(body, args.tests)
            firsts[name].append(first)
            others[name].append(rest)
        tansu.append(tansu_startup_s())
    baseline = statistics.median(tansu)
    print(f"TierbrokerCluster start / stop, median of {args.rounds} (seconds)")
    for name in SHAPES:
        up, down = statistics.median(starts[name]), statistics.median(stops[name])
        print(f"  {name:<27} start {up:.3f}  stop {down:.3f}  ({up / baseline:.1f}x Tansu's start)")
    print(f"  Tansu, spawned to ApiVersions: {baseline:.3f}")
    plain = statistics.median(others["no fixture"])
    print("function-scoped fixture: setup + teardown a test adds, the first test's (seconds)")
    for name in FIXTURES:
        if name != "no fixture":
            each = statistics.median(others[name]) - plain
            first = statistics.median(firsts[name]) - statistics.median(firsts["no fixture"])
            print(f"  {name:<38} {each:.3f} a test, {first:.2f} the first (imports the broker)")


if __name__ == "__main__":
    main()
