"""Export a topic's remote tier to Parquet, partitioned by topic, partition and date.

    spark-submit pipeline/jobs/export.py --storage s3://bucket/prefix?endpoint=... \\
        --topic events --to s3a://lake/events [--option storage.aws.access.key.id=...]
    tierbroker export --topic events --storage file:///data/remote --to lake/   # local[*]

Rows have the `tierbroker` source's schema with headers (Spark's Kafka schema,
`includeHeaders=true`, unless an `--option` says otherwise) plus `date`,
the UTC day of the record timestamp; directories are
`topic=<t>/partition=<p>/date=<yyyy-mm-dd>/`.

The job lists the remote segments, leaves out those already exported, and writes
the rest a few segments per Spark job (`--segments-per-job`). After each job
commits, it writes one small marker per segment in `<output>/_exported_segments/`
(the name is the segment id, the content what was written), so a run that is
stopped resumes where it stopped. Segments are immutable, so a marker stays
true. A crash between a job's commit and its markers re-exports that job's
segments on the next run (duplicates of at most `--segments-per-job` segments).
Progress goes to stdout, one line per job.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

import typer

from tierbroker.pipeline import SPARK_INSTALL
from tierbroker.pipeline.discovery import RemoteSegment

MARKER_DIR = "_exported_segments"


@dataclass(frozen=True)
class ExportArgs:
    """What `tierbroker export` was asked to do (see `command` for each option)."""

    storage: str
    topic: str
    output: str
    cluster: str | None
    entropy_bits: int
    partitions: str | None
    isolation_level: IsolationLevel
    options: tuple[str, ...]
    segments_per_job: int
    max_segments: int
    master: str


class Format(StrEnum):
    parquet = "parquet"


class IsolationLevel(StrEnum):
    read_uncommitted = "read_uncommitted"
    read_committed = "read_committed"


app = typer.Typer(add_completion=False, rich_markup_mode=None)


@app.command()
def command(
    storage: Annotated[
        str, typer.Option(metavar="URL", help="file:///dir or s3://bucket/prefix?...")
    ],
    topic: Annotated[str, typer.Option(help="a topic, or several separated by commas")],
    output: Annotated[
        str, typer.Option("--to", metavar="DIR", help="the output directory or Hadoop URI")
    ],
    _format: Annotated[Format, typer.Option("--format", help="the output format")] = (
        Format.parquet
    ),
    cluster: Annotated[
        str | None, typer.Option(help="the cluster id (default: found by listing)")
    ] = None,
    entropy_bits: Annotated[int, typer.Option(help="the broker's entropy bits")] = 0,
    partitions: Annotated[
        str | None, typer.Option(help="comma-separated partition numbers (default: all)")
    ] = None,
    isolation_level: Annotated[
        IsolationLevel,
        typer.Option(
            help="read_committed: no record of an aborted transaction, nor control records; "
            "a segment past what the store proves decided waits for a later run"
        ),
    ] = IsolationLevel.read_uncommitted,
    options: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            metavar="KEY=VALUE",
            help="another option of the tierbroker source (credentials, startingOffsets, "
            "...), repeatable",
        ),
    ] = None,
    segments_per_job: Annotated[
        int, typer.Option(help="segments one Spark job writes: a stopped run redoes at most these")
    ] = 16,
    max_segments: Annotated[int, typer.Option(help="stop after N (0: all)")] = 0,
    master: Annotated[
        str, typer.Option(help="Spark's master, when no Spark session exists yet")
    ] = "local[*]",
) -> None:
    """Export a topic's remote tier to Parquet with Spark, straight from the object store.
    Exit status 1 without Spark or with no remote segment of the topic in the store; 2
    for a storage URL or an option that does not work."""
    args = ExportArgs(
        storage,
        topic,
        output,
        cluster,
        entropy_bits,
        partitions,
        isolation_level,
        tuple(options or ()),
        segments_per_job,
        max_segments,
        master,
    )
    missing = missing_spark()
    if missing is not None:
        print(missing, file=sys.stderr)
        raise typer.Exit(1)
    source = source_options(args)
    try:
        segments = remote_segments(source)
    except ValueError as e:  # a storage URL or an --option that does not work
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    if not segments:
        print(f"error: no remote segments of topic {args.topic} in {args.storage}", file=sys.stderr)
        raise typer.Exit(1)
    export(args, source, segments)


def source_options(args: ExportArgs) -> dict[str, str]:
    """The `tierbroker` source options the arguments stand for."""
    options = {"storage": args.storage, "topic": args.topic, "includeHeaders": "true"}
    if args.cluster:
        options["cluster"] = args.cluster
    if args.entropy_bits:
        options["key.prefix.entropy.bits"] = str(args.entropy_bits)
    if args.partitions:
        options["partitions"] = args.partitions
    if args.isolation_level is IsolationLevel.read_committed:
        options["kafka.isolation.level"] = "read_committed"
    for item in args.options:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--option")
        options[key] = value
    return options


class Markers:
    """`<output>/_exported_segments/<segment id>`: locally, or on any Hadoop file system
    (through the Spark session `spark()` gives, which only such an output starts)."""

    def __init__(self, output: str, spark: Callable[[], Any]) -> None:
        parsed = urlparse(output)
        self.local: Path | None = None
        if parsed.scheme in ("", "file"):
            self.local = Path(parsed.path if parsed.scheme else output) / MARKER_DIR
            self.local.mkdir(parents=True, exist_ok=True)
        else:
            session = spark()
            jvm = session._jvm
            self._path = jvm.org.apache.hadoop.fs.Path(f"{output.rstrip('/')}/{MARKER_DIR}")
            self._fs = self._path.getFileSystem(session._jsc.hadoopConfiguration())
            self._jvm = jvm

    def done(self) -> set[str]:
        if self.local is not None:
            return {p.name for p in self.local.iterdir() if not p.name.startswith(".")}
        if not self._fs.exists(self._path):
            return set()
        return {status.getPath().getName() for status in self._fs.listStatus(self._path)}

    def mark(self, segment: RemoteSegment) -> None:
        body = json.dumps(
            {
                "topic": segment.topic,
                "partition": segment.partition,
                "start_offset": segment.start_offset,
                "end_offset": segment.end_offset,
                "size": segment.size,
                "exported_at_ms": int(time.time() * 1000),
            }
        )
        if self.local is not None:
            tmp = self.local / f".{segment.segment_id}.tmp"
            tmp.write_text(body, encoding="utf-8")
            os.replace(tmp, self.local / segment.segment_id)
            return
        stream = self._fs.create(
            self._jvm.org.apache.hadoop.fs.Path(self._path, segment.segment_id)
        )
        try:
            stream.write(bytearray(body.encode()))
        finally:
            stream.close()


def _session(master: str) -> Any:
    """The active Spark session, or a new one (`register` picks its Python workers)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    return (
        SparkSession.builder.appName("tierbroker-export")
        .master(master)
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .getOrCreate()
    )


def remote_segments(options: dict[str, str]) -> dict[str, RemoteSegment]:
    """The topic's remote segments by id, listed from the store, without Spark. Raises
    ValueError for a storage URL or an option that does not work.

    Read committed, a segment reaching past what the store proves decided is left for a
    later run: its marker would otherwise claim records it could not export."""
    from tierbroker.pipeline.spark.bounds import TopicView, resolve
    from tierbroker.pipeline.spark.options import ReadOptions
    from tierbroker.pipeline.spark.plan import RemoteSlice, plan_ranges

    read = ReadOptions.parse(options)
    segments: dict[str, RemoteSegment] = {}
    with TopicView(read) as view:
        for task in plan_ranges(view, read, resolve(view, read)):
            stable_end = view.stable_end((task.topic, task.partition))
            for piece in task.pieces:
                if not isinstance(piece, RemoteSlice):
                    continue
                if stable_end is None or piece.segment.end_offset < stable_end:
                    segments.setdefault(piece.segment.segment_id, piece.segment)
    return segments


def export(args: ExportArgs, options: dict[str, str], segments: dict[str, RemoteSegment]) -> int:
    """Export those of `segments` not exported yet, read with the source `options`; returns
    how many were exported now. Spark starts only when there is something to write (or the
    output needs Hadoop)."""
    markers = Markers(args.output, lambda: _session(args.master))
    done = markers.done()
    pending = [s for s in segments.values() if s.segment_id not in done]
    if args.max_segments > 0:
        pending = pending[: args.max_segments]
    print(
        f"export {args.topic}: {len(segments)} remote segments, {len(done & set(segments))} "
        f"already exported, {len(pending)} to export now",
        flush=True,
    )
    if not pending:
        return 0
    from pyspark.sql import functions as F

    from tierbroker.pipeline.spark import register

    spark = _session(args.master)
    register(spark)
    started = time.monotonic()
    exported_bytes = 0
    step = max(1, args.segments_per_job)
    for first in range(0, len(pending), step):
        batch = pending[first : first + step]
        frame = (
            spark.read.format("tierbroker")
            .options(**options, segments=",".join(s.segment_id for s in batch))
            .load()
        )
        day = F.date_from_unix_date(F.floor(F.unix_millis("timestamp") / 86_400_000).cast("int"))
        (
            frame.withColumn("date", day)
            .write.mode("append")
            .partitionBy("topic", "partition", "date")
            .parquet(args.output)
        )
        for segment in batch:
            markers.mark(segment)
        exported_bytes += sum(s.size for s in batch)
        elapsed = time.monotonic() - started
        print(
            f"export {args.topic}: {first + len(batch)}/{len(pending)} segments, "
            f"{exported_bytes / 1e6:.1f} MB in {elapsed:.1f}s "
            f"({exported_bytes / 1e6 / max(elapsed, 1e-9):.1f} MB/s)",
            flush=True,
        )
    return len(pending)


def missing_spark() -> str | None:
    """What to install, in one line, if PySpark or PyArrow is missing; else None."""
    for module, name in (("pyspark", "PySpark"), ("pyarrow", "PyArrow")):
        if importlib.util.find_spec(module) is None:
            return f"tierbroker export needs {name}: {SPARK_INSTALL}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (`tierbroker export`, or spark-submit): its exit status."""
    try:
        typer.main.get_command(app).main(argv, prog_name="tierbroker export")
    except SystemExit as e:  # how a command's status comes back, usage errors' 2 included
        return e.code if isinstance(e.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
