"""The record-batch compression codecs, as Kafka's clients write them, on `cramjam`.

A compressed batch holds its records section (everything after byte 61) as one
compressed stream:

* gzip: a gzip stream (RFC 1952).
* snappy: either one raw snappy block (librdkafka) or xerial framing (the Java
  client's snappy-java)::

      0  magic b"\\x82SNAPPY\\x00"   8  version int32   12 compatible int32
      16 [length int32 big-endian][raw snappy block of that length] ...

* lz4: an LZ4 frame; the Java client refuses linked blocks, so we write independent ones.
* zstd: a zstd frame; the Java client streams, so the frame may lack a content size.
"""

from __future__ import annotations

import struct
from typing import assert_never

import cramjam

from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records.batch import Compression, InvalidRecordError

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16
_INT32 = struct.Struct(">i")
_ZSTD_LEVEL = 3  # the Java client's and librdkafka's default
_LZ4_DEFAULT_LEVEL = 9  # Kafka's: the fast compressor (cramjam's level 0)


def compress(codec: Compression, data: bytes | memoryview, level: int | None = None) -> bytes:
    """Compress a batch's records section; snappy is written raw, as librdkafka does.

    `level` is Kafka's for the codec (KIP-390; None: its default): gzip 1 to 9, lz4 1
    to 17 (9, the default, is LZ4's fast compressor, any other its high-compression
    one), zstd -131072 to 22 (default 3). Snappy has none.
    """
    match codec:
        case Compression.NONE:
            return bytes(data)
        case Compression.GZIP:
            return bytes(cramjam.gzip.compress(data, level=level))
        case Compression.SNAPPY:
            return bytes(cramjam.snappy.compress_raw(data))
        case Compression.LZ4:
            compressor = cramjam.lz4.Compressor(
                level=0 if level in (None, _LZ4_DEFAULT_LEVEL) else level,
                content_checksum=False,
                block_linked=False,
            )
            compressor.compress(bytes(data))  # its streaming compressor takes bytes only
            return bytes(compressor.finish())
        case Compression.ZSTD:
            return bytes(cramjam.zstd.compress(data, level=_ZSTD_LEVEL if level is None else level))
    assert_never(codec)


def decompress(codec: Compression, data: bytes | memoryview) -> bytes:
    """Decompress a batch's records section; bad input raises `InvalidRecordError`."""
    try:
        match codec:
            case Compression.NONE:
                return bytes(data)
            case Compression.GZIP:
                return bytes(cramjam.gzip.decompress(data))
            case Compression.SNAPPY:
                if bytes(data[:8]) == XERIAL_MAGIC:
                    return _xerial_decompress(data)
                return bytes(cramjam.snappy.decompress_raw(data))
            case Compression.LZ4:
                return bytes(cramjam.lz4.decompress(data))
            case Compression.ZSTD:
                # cramjam streams, so frames without a content size decode too.
                return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise InvalidRecordError(
            ErrorCode.corrupt_message, f"{codec.name.lower()} payload does not decompress: {exc}"
        ) from exc
    assert_never(codec)


def _xerial_decompress(data: bytes | memoryview) -> bytes:
    """Join the raw snappy blocks of a xerial stream; version and compat are not checked,
    as some producers write them little-endian."""
    view = memoryview(data)
    position, end = _XERIAL_HEADER_SIZE, len(view)
    parts = []
    while position < end:
        if end - position < 4:
            raise InvalidRecordError(
                ErrorCode.corrupt_message,
                f"snappy: {end - position} trailing bytes at xerial position {position}",
            )
        (length,) = _INT32.unpack_from(view, position)
        position += 4
        if length < 0 or position + length > end:
            raise InvalidRecordError(
                ErrorCode.corrupt_message,
                f"snappy: xerial block of {length} bytes at position {position - 4} "
                f"overruns the {end}-byte payload",
            )
        parts.append(bytes(cramjam.snappy.decompress_raw(view[position : position + length])))
        position += length
    return b"".join(parts)
