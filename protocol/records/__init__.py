"""Record batches (magic 2).

`BatchView` reads and patches batch headers in place and is what the produce and
fetch hot paths use; on produce, `validation` walks a batch's records without
decoding them (compiled in `_walk.c`); `decoder` and `builder` handle whole records for the readers
that need them (pipeline, tests), never the hot paths; `codecs` holds the
compression codecs they share.
"""

from tierbroker.protocol.records.batch import (
    BATCH_HEADER_SIZE,
    BatchView,
    Compression,
    InvalidRecordError,
    TimestampType,
    iter_batches,
    whole_batches_size,
)
from tierbroker.protocol.records.builder import build_batch
from tierbroker.protocol.records.codecs import compress, decompress
from tierbroker.protocol.records.decoder import (
    DecodedBatch,
    Header,
    Record,
    decode_batch,
    decode_records,
)
from tierbroker.protocol.records.validation import validate_records

__all__ = [
    "BATCH_HEADER_SIZE",
    "BatchView",
    "Compression",
    "DecodedBatch",
    "Header",
    "InvalidRecordError",
    "Record",
    "TimestampType",
    "build_batch",
    "compress",
    "decode_batch",
    "decode_records",
    "decompress",
    "iter_batches",
    "validate_records",
    "whole_batches_size",
]
