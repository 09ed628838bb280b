"""`tierbroker demo`, end to end.

- Run in this process, its closing table is checked, while the brokers still run,
  against what each broker's own endpoint serves (`/metrics`: ConsumerBytesOut,
  RemoteCopyRequestsPerSec, RemoteFetchRequestsPerSec; `/tier/status`: the remote tier's
  bytes) and against the files on disk (each broker's local segments, the remote tier's
  segment objects); both reads from offset 0 got what they should.
- The command itself runs as the README prints it (`test_readme.py`).
"""

from __future__ import annotations

import io
import json
import re
import urllib.request
from pathlib import Path

from rich.console import Console

from tierbroker.broker.cli.demo import (
    TOPIC,
    BrokerUse,
    Demo,
    DemoReport,
    human_size,
    report_tables,
)


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        text: str = answer.read().decode()
        return text


def metric(text: str, name: str, **labels: str) -> float:
    """A sample of the Prometheus text summed over the labels not given (topic: TOPIC)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if found.get("topic") == TOPIC and all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def files_bytes(directory: Path, pattern: str) -> int:
    return sum(f.stat().st_size for f in directory.glob(pattern))


def test_the_demo_table_agrees_with_the_brokers_metrics(tmp_path: Path) -> None:
    screen = io.StringIO()
    console = Console(file=screen, width=140)
    demo = Demo(tmp_path, mib=2, console=console)
    with demo.running():
        report = demo.run()
        ports = {b.broker_id: b.endpoints.metrics_port for b in demo.cluster.brokers}
        scraped = {b: get(port, "/metrics") for b, port in ports.items() if port is not None}
        tiers = [
            row for port in ports.values() if port for row in json.loads(get(port, "/tier/status"))
        ]
        # On disk while the brokers run: leadership moves when they stop.
        local_files = {
            b: files_bytes(tmp_path / "brokers" / f"broker-{b}", f"{TOPIC}-*/*.log") for b in ports
        }
    assert len(scraped) == 3

    for use in report.brokers:
        text = scraped[use.broker_id]
        assert use.same_rack_bytes == metric(text, "ConsumerBytesOut_total", locality="same-rack")
        assert use.cross_rack_bytes == metric(text, "ConsumerBytesOut_total", locality="cross-rack")
        assert use.unknown_rack_bytes == metric(text, "ConsumerBytesOut_total", locality="unknown")
        assert use.segments_copied == metric(text, "RemoteCopyRequestsPerSec_total")
        assert use.remote_reads == metric(text, "RemoteFetchRequestsPerSec_total")
        assert use.local_bytes == local_files[use.broker_id]
    ours = [row for row in tiers if row["topic"] == TOPIC]
    assert report.remote_bytes == sum(row["remote_bytes"] for row in ours)
    assert report.remote_bytes == files_bytes(tmp_path / "remote", f"**/{TOPIC}-*/**/*.log")
    assert sum(b.leads for b in report.brokers) == 3

    # The story the table tells: every rolled segment tiered once, the consumer in rack b
    # served by the broker in rack b (old offsets from the remote tier), the direct
    # reader getting the tiered part.
    assert sum(b.segments_copied for b in report.brokers) == report.remote_segments > 0
    in_b, others = _split(report, "b")
    assert in_b.same_rack_bytes >= report.produced_bytes
    assert in_b.remote_reads > 0
    assert all(b.same_rack_bytes == b.cross_rack_bytes == 0 for b in others)
    assert report.rack_read_records == report.records
    tiered_records = sum(row["remote_log_end_offset"] + 1 for row in ours)
    assert report.direct_records == tiered_records

    table = io.StringIO()
    Console(file=table, width=140).print(report_tables(report))
    rendered = table.getvalue()
    for b in report.brokers:
        assert f"broker {b.broker_id} ({b.rack})" in rendered
    assert human_size(in_b.same_rack_bytes) in rendered
    assert human_size(report.remote_bytes) in rendered
    assert "produced 2048 records" in screen.getvalue()


def _split(report: DemoReport, rack: str) -> tuple[BrokerUse, list[BrokerUse]]:
    (in_rack,) = [b for b in report.brokers if b.rack == rack]
    return in_rack, [b for b in report.brokers if b.rack != rack]
