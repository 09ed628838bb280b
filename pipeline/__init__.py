"""Readers of the remote tier outside the broker: `TieredConsumer` and the Spark source.

Everything here reads the object store the broker's remote storage plugin writes
(`storage.remote.key_layout.ObjectKeyLayout`) and trusts only segments whose
manifest exists; it imports `protocol` and `storage`, never `rlm` or `broker`.

- `pipeline.TieredConsumer` / `pipeline.ConsumptionMode`: an aiokafka consumer that
  reads remote offsets straight from the object store (`pipeline.consumer`).
- `pipeline.spark.register(spark)`: the `tierbroker` PySpark data source.
- `pipeline.jobs.export`: a topic's remote tier to Parquet.

The consumer is imported lazily, so Spark executors that only read segments do
not import aiokafka.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tierbroker.pipeline.consumer import TieredConsumer
    from tierbroker.pipeline.modes import ConsumptionMode, TieredConsumerStats

__all__ = ["ConsumptionMode", "TieredConsumer", "TieredConsumerStats"]

SPARK_INSTALL = "pip install 'pyspark>=4.0' 'pyarrow>=14' (tierbroker's spark extra)"
"""How to install what the Spark source and the export job need: the extra's own pins,
since `pip install 'tierbroker[spark]'` needs tierbroker on an index."""


def __getattr__(name: str) -> Any:
    if name == "TieredConsumer":
        from tierbroker.pipeline.consumer import TieredConsumer

        return TieredConsumer
    if name in ("ConsumptionMode", "TieredConsumerStats"):
        from tierbroker.pipeline import modes

        return getattr(modes, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
