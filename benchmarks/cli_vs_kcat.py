"""The everyday commands beside kcat: start-up, and lines produced and consumed.

    python -m benchmarks.cli_vs_kcat [--lines 1000000] [--rounds 3]

Against one tierbroker broker (the shipped config), wall time of:
- `tierbroker --help`, and `tierbroker cluster info` (start-up to the first request
  answered), each the median of 10 runs;
- producing `--lines` lines of 100 bytes from a file: `tierbroker produce T < file`
  against `kcat -P -b B -t T -l file`, each to its own topic of one partition, and
  against kcat with `-X enable.idempotence=true`, the guarantee `tierbroker produce`
  gives (librdkafka's default is off; Kafka's console producer's is on);
- consuming them to /dev/null: `tierbroker consume T -e` against `kcat -C -b B -t T -e -q`.
Rounds alternate which tool goes first (ABBA). Reported: medians, and the ratios
tierbroker / kcat (time: lower is better; the goal is 2x or less).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.targets import running, tierbroker_command

LINE_BYTES = 100


def timed(command: Sequence[str], stdin: Path | None = None) -> float:
    """Wall seconds of `command`, its output discarded; fails if it fails."""
    started = time.perf_counter()
    with open(stdin or "/dev/null", "rb") as given:
        done = subprocess.run(
            command, stdin=given, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600
        )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kcat = shutil.which("kcat")
    if kcat is None:
        raise SystemExit("kcat is needed: apt-get install -y kcat")
    tierbroker = tierbroker_command()
    with tempfile.TemporaryDirectory() as tmp, running("tierbroker") as broker:
        lines = Path(tmp) / "lines"
        with lines.open("wb") as f:
            for i in range(args.lines):
                f.write(f"{i:0{LINE_BYTES - 1}d}\n".encode())
        b = ["-b", broker.bootstrap]
        help_s = statistics.median(timed([tierbroker, "--help"]) for _ in range(10))
        info_s = statistics.median(timed([tierbroker, "cluster", "info", *b]) for _ in range(10))
        results: dict[str, dict[str, list[float]]] = {
            "produce": {"tierbroker": [], "kcat": [], "kcat idempotent": []},
            "consume": {"tierbroker": [], "kcat": []},
        }
        for round_ in range(args.rounds):
            order = ("tierbroker", "kcat") if round_ % 2 == 0 else ("kcat", "tierbroker")
            for tool in order:
                topic = f"{tool}-{round_}"
                timed([tierbroker, "topic", "create", topic, "-p", "1", *b])
                if tool == "tierbroker":
                    produce = [tierbroker, "produce", topic, *b]
                    consume = [tierbroker, "consume", topic, "-e", *b]
                    results["produce"][tool].append(timed(produce, stdin=lines))
                else:
                    produce = [kcat, "-P", *b, "-l", str(lines)]
                    consume = [kcat, "-C", *b, "-t", topic, "-e", "-q"]
                    results["produce"][tool].append(timed([*produce, "-t", topic]))
                    timed([tierbroker, "topic", "create", f"{topic}-idempotent", "-p", "1", *b])
                    idempotent = [*produce, "-X", "enable.idempotence=true"]
                    results["produce"]["kcat idempotent"].append(
                        timed([*idempotent, "-t", f"{topic}-idempotent"])
                    )
                results["consume"][tool].append(timed(consume))
                print(
                    f"round {round_ + 1} {tool}: produce {results['produce'][tool][-1]:.2f} s, "
                    f"consume {results['consume'][tool][-1]:.2f} s",
                    flush=True,
                )
    print(f"\n{args.lines:,} lines of {LINE_BYTES} bytes, {args.rounds} rounds (ABBA)")
    print(f"tierbroker --help          {help_s:.3f} s (median of 10)")
    print(f"tierbroker cluster info    {info_s:.3f} s (median of 10; start-up to an answer)")
    for phase, by_tool in results.items():
        ours = statistics.median(by_tool["tierbroker"])
        for theirs_name in (t for t in by_tool if t != "tierbroker"):
            theirs = statistics.median(by_tool[theirs_name])
            print(
                f"{phase:8} tierbroker {ours:6.2f} s  {theirs_name} {theirs:6.2f} s  "
                f"ratio {ours / theirs:.2f}x"
            )


if __name__ == "__main__":
    main()
