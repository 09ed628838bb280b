"""Record batches (magic 2).

`BatchView` reads and patches batch headers in place and is what the produce and
fetch hot paths use; `decode` and `build` handle whole records for the readers
that need them (pipeline, tests), never the hot paths.
"""

from protocol.records.batch import (
    BATCH_HEADER_SIZE,
    BatchView,
    Compression,
    InvalidRecordError,
    TimestampType,
    iter_batches,
)

__all__ = [
    "BATCH_HEADER_SIZE",
    "BatchView",
    "Compression",
    "InvalidRecordError",
    "TimestampType",
    "iter_batches",
]
