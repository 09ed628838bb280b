"""Start-up to the first ApiVersions answer: a plain install against this environment.

A plain install is what `pip install tierbroker` gives a user: the project's wheel and its
own dependencies, no test extras, in a fresh virtualenv (built once, in a temp dir). This
environment is the development one (`make install-test`), where kio also imports
hypothesis. Both start `tierbroker serve` with the shipped config, in turn, round after
round, each in a fresh data dir; the medians are reported, and the modules that took the
longest to import in the plain install.

    python -m benchmarks.startup              # about a minute, most of it the install
    python -m benchmarks.startup --rounds 9
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import targets
from benchmarks.targets import ROOT, start_tierbroker, stop


def plain_install(directory: Path) -> Path:
    """A fresh virtualenv with this tree's tracked files installed, no extras; its command."""
    source = directory / "source"
    source.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    venv = directory / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--prefer-binary", str(source)],
        check=True,
    )
    return venv / "bin" / "tierbroker"


def startup_s(command: str) -> float:
    targets.tierbroker_command = lambda: command  # the harness starts what it names
    with tempfile.TemporaryDirectory() as workdir:
        broker = start_tierbroker(Path(workdir))
        stop(broker)
    return broker.startup_s


def slowest_imports(python: Path, count: int) -> list[tuple[str, float]]:
    """The modules whose import took longest, their own time without what they import."""
    run = subprocess.run(
        [str(python), "-X", "importtime", "-c", "import tierbroker.broker.cli.main"],
        capture_output=True,
        text=True,
        check=True,
    )
    own = []
    for line in run.stderr.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if found:
            own.append((found.group(2), int(found.group(1)) / 1000))
    return sorted(own, key=lambda item: -item[1])[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    here = targets.tierbroker_command()
    directory = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        plain = str(plain_install(directory))
        times: dict[str, list[float]] = {"plain install": [], "this environment": []}
        for _ in range(args.rounds):
            times["plain install"].append(startup_s(plain))
            times["this environment"].append(startup_s(here))
        imports = slowest_imports(Path(plain).with_name("python"), 5)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"spawn -> ApiVersions answered, median of {args.rounds} (seconds)")
    for name, values in times.items():
        rounds = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {name:<17} {statistics.median(values):.3f}   ({rounds})")
    ratio = statistics.median(times["plain install"]) / statistics.median(times["this environment"])
    print(f"  plain / this environment: {ratio:.2f}x")
    print("slowest imports in the plain install (ms, own time):")
    print("  " + ", ".join(f"{name} {ms:.0f}" for name, ms in imports))


if __name__ == "__main__":
    main()
