"""The Spark session of the tests: `local[2]`, no UI, UTC, two shuffle partitions, the
`tierbroker` source registered, and Spark's own Kafka source on the classpath.

A Python process has one Spark JVM, started by its first session: a jar set on a later
session never reaches the driver's classpath. Every Spark test module on a pytest worker
builds its session here, so whichever comes first starts the JVM with Spark's Kafka
source, and the modules can share a worker in any order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.spark_kafka import kafka_source_jars

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def spark_session(app_name: str, **config: str) -> Iterator[Any]:
    """A session named `app_name` with `config` added, stopped on exit. The Python
    workers find this checkout's `tests` package (PYTHONPATH) for the sources tests
    define, and the interpreter `register` chooses."""
    from pyspark.sql import SparkSession

    from tierbroker.pipeline.spark import register

    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYTHONPATH")}
    os.environ.pop("PYSPARK_PYTHON", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.jars", kafka_source_jars())
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register(session)
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
