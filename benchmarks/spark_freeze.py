"""What freezing Spark's Python workers (`gc.freeze()` after their first task) saves.

    python -m benchmarks.spark_freeze [--mib 384] [--rounds 5]

PySpark's daemon runs `gc.collect()` after every task of a reused Python worker, and
that walks every object the worker holds unless they are frozen. The `tierbroker`
source freezes a worker once its first task has imported everything
(`pipeline.spark.read.set_up_worker`). Here two variants of the source share one
session: `tierbroker-frozen` as shipped, `tierbroker-thawed` unfreezing the worker
at the start of each of its tasks (and not freezing it again), so the collections
after its tasks walk everything. They read the same tiered topic (as
`benchmarks.pipeline` writes it) in interleaved rounds after a warm-up, at the
default input partitions (128 MiB) and at 8 MiB ones (one task per segment);
reported: MB per CPU second of Spark (the JVM, its workers, the driver) and the
median of the per-round ratios frozen / thawed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from benchmarks.pipeline import OVERRIDES, TOPIC, fill, tree_cpu_seconds
from benchmarks.targets import ROOT, free_port, start_tierbroker, stop
from tierbroker.pipeline.spark import read as read_module
from tierbroker.pipeline.spark.partitions import read_partition
from tierbroker.pipeline.spark.source import TierbrokerDataSource, TierbrokerReader

MIB = 1 << 20


class FrozenReader(TierbrokerReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        read_module._frozen = False  # freeze again after a thawed task
        return read_partition(partition, self.schema)


class ThawedReader(TierbrokerReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        gc.unfreeze()
        read_module._frozen = True  # and no freezing in this task
        return read_partition(partition, self.schema)


class FrozenSource(TierbrokerDataSource):
    @classmethod
    def name(cls) -> str:
        return "tierbroker-frozen"

    def reader(self, schema: StructType) -> DataSourceReader:
        base = super().reader(schema)
        assert isinstance(base, TierbrokerReader)
        return FrozenReader(base.options, schema)


class ThawedSource(TierbrokerDataSource):
    @classmethod
    def name(cls) -> str:
        return "tierbroker-thawed"

    def reader(self, schema: StructType) -> DataSourceReader:
        base = super().reader(schema)
        assert isinstance(base, TierbrokerReader)
        return ThawedReader(base.options, schema)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark_freeze")
    parser.add_argument("--mib", type=int, default=384, help="MiB of 1 KiB values produced")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per partitioning")
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    from tierbroker.pipeline.spark import register

    with tempfile.TemporaryDirectory(prefix="tierbroker-freeze-") as tmp:
        workdir = Path(tmp)
        metrics_port = str(free_port())
        broker = start_tierbroker(workdir, {**OVERRIDES, "metrics.port": metrics_port})
        try:
            ends = fill(broker, metrics_port, args.mib, 1024)
            storage = (workdir / "data" / "remote").as_uri()
            os.environ["PYSPARK_PYTHON"] = sys.executable
            os.environ["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
            )
            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            register(spark, filter_pushdown=False)
            spark.dataSource.register(FrozenSource)
            spark.dataSource.register(ThawedSource)
            jvm = spark.sparkContext._jvm.ProcessHandle.current().pid()  # type: ignore[union-attr]
            ending = json.dumps({TOPIC: {str(p): end for p, end in ends.items()}})
            try:
                for label, size in (("128 MiB", 128 * MIB), ("8 MiB", 8 * MIB)):
                    options = {
                        "storage": storage,
                        "subscribe": TOPIC,
                        "endingOffsets": ending,
                        "maxBytesPerPartition": str(size),
                    }
                    rates: dict[str, list[float]] = {"frozen": [], "thawed": []}
                    for number in range(args.rounds + 1):
                        order = ["frozen", "thawed"] if number % 2 else ["thawed", "frozen"]
                        for name in order:
                            cpu = tree_cpu_seconds(jvm) + time.process_time()
                            frame = spark.read.format(f"tierbroker-{name}").options(**options)
                            read = frame.load().selectExpr("sum(length(value))").first()[0]
                            used = tree_cpu_seconds(jvm) + time.process_time() - cpu
                            if number:  # round 0 warms up
                                rates[name].append(read / 1e6 / used)
                    ratios = [f / t for f, t in zip(rates["frozen"], rates["thawed"], strict=True)]
                    print(
                        f"{label} input partitions: frozen "
                        f"{statistics.median(rates['frozen']):.0f} MB/CPU s, thawed "
                        f"{statistics.median(rates['thawed']):.0f}; frozen / thawed "
                        f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                        flush=True,
                    )
            finally:
                spark.stop()
        finally:
            stop(broker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
