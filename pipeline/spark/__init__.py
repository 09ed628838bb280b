"""The `tierbroker` Spark data source: a topic's remote tier as Spark's Kafka schema.

    from tierbroker.pipeline.spark import register
    register(spark)
    df = spark.read.format("tierbroker").option("storage", "s3://bucket/prefix?...") \\
        .option("topic", "events").option("startingOffsets", "earliest").load()

The source runs in Spark's Python workers, so they must import tierbroker and
pyarrow (tierbroker's `spark` extra: PySpark >= 4.0); `register` sees to it
for a local session (see there).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

from tierbroker.pipeline import SPARK_INSTALL

try:
    import pyspark

    from tierbroker.pipeline.spark.source import (
        KAFKA_SCHEMA,
        FilteringDataSource,
        TierbrokerDataSource,
    )
except ModuleNotFoundError as e:
    if (e.name or "").partition(".")[0] not in ("pyspark", "pyarrow", "py4j"):
        raise
    raise ModuleNotFoundError(
        f"tierbroker.pipeline.spark needs {e.name}: {SPARK_INSTALL}", name=e.name
    ) from None

__all__ = ["KAFKA_SCHEMA", "TierbrokerDataSource", "register"]

log = logging.getLogger(__name__)

SPARK_DEFAULT_PYTHON = "python3"  # SparkContext's worker interpreter without PYSPARK_PYTHON
WORKER_IMPORTS = "import pyarrow, tierbroker.pipeline.storage"
FILTER_PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, filter_pushdown: bool = True) -> None:
    """Register format "tierbroker" with a SparkSession (once per session is enough).

    With `filter_pushdown` (and PySpark >= 4.1), filters on `partition`, `offset` and
    `timestamp` narrow the plan: this turns on the session's
    `spark.sql.python.filterPushdown.enabled`, without which PySpark refuses a reader
    that takes filters. Other Python data sources keep working as before with it on.

    Local master (`local`, `local[N]`, ...): the Python workers run on this machine.
    Without PYSPARK_PYTHON, Spark would start them with `python3` from PATH, which
    rarely has tierbroker and pyarrow, so the session's workers use this interpreter
    (every Python function registered after this call, too). With PYSPARK_PYTHON
    set, that interpreter is checked to import both, and a RuntimeError says what
    to set if it cannot.

    Any other master: the executors' interpreter is the cluster's choice
    (PYSPARK_PYTHON or `spark.pyspark.python` at submit time) and cannot be seen
    from here; it must have `tierbroker[spark]` installed. Spark Connect sessions
    have no SparkContext here: their workers are the server's.
    """
    context = getattr(spark, "_sc", None)
    if context is not None and str(context.master).startswith("local"):
        context.pythonExec = local_worker_python(str(context.pythonExec))
    version = tuple(int(x) for x in pyspark.__version__.split(".")[:2])
    if filter_pushdown and version >= (4, 1):
        spark.conf.set(FILTER_PUSHDOWN, "true")
        spark.dataSource.register(FilteringDataSource)
    else:
        spark.dataSource.register(TierbrokerDataSource)


def local_worker_python(configured: str) -> str:
    """The interpreter local Python workers should run, given the SparkContext's."""
    if "PYSPARK_PYTHON" not in os.environ and configured == SPARK_DEFAULT_PYTHON:
        log.info("Spark's Python workers use %s (PYSPARK_PYTHON is not set)", sys.executable)
        return sys.executable
    if configured == sys.executable:
        return configured
    try:
        checked = subprocess.run(
            [configured, "-c", WORKER_IMPORTS], capture_output=True, timeout=60, check=False
        )
        ok = checked.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise RuntimeError(
            f"Spark's Python workers ({configured}, from PYSPARK_PYTHON) cannot import "
            f"tierbroker and pyarrow: set PYSPARK_PYTHON={sys.executable} or unset it"
        )
    return configured
