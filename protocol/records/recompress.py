"""Re-encode a batch with another codec, as Kafka's LogValidator does for a topic whose
`compression.type` is not the producer's.

Only the records section changes codec: it is decompressed and compressed again,
its records untouched (their offset deltas are already 0, 1, ... once validated).
The new header is the old one with the codec bits of attributes, batchLength and
the CRC32C rewritten; offsets, timestamps, producer fields and flags stay.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from tierbroker.protocol.records.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    CRC_OFFSET,
    LOG_OVERHEAD,
    BatchView,
    Compression,
)
from tierbroker.protocol.records.codecs import compress, decompress

_CODEC_BITS = 0x07
_BATCH_LENGTH_OFFSET = 8


def recompress(view: BatchView, codec: Compression, level: int | None = None) -> bytearray:
    """The batch at `view` with its records compressed with `codec` at Kafka's `level`.

    Decompresses without a size bound: call it on batches `validate_records` passed,
    which bounds what they expand to.
    """
    records = view.records_payload()
    if view.compression is not Compression.NONE:
        records = memoryview(decompress(view.compression, records))
    payload = compress(codec, records, level)
    batch = bytearray(BATCH_HEADER_SIZE + len(payload))
    batch[:BATCH_HEADER_SIZE] = view.payload()[:BATCH_HEADER_SIZE]
    batch[BATCH_HEADER_SIZE:] = payload
    struct.pack_into(">i", batch, _BATCH_LENGTH_OFFSET, len(batch) - LOG_OVERHEAD)
    struct.pack_into(">h", batch, ATTRIBUTES_OFFSET, view.attributes & ~_CODEC_BITS | codec)
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return batch
