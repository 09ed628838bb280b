"""What compressing and encrypting remote segments costs per MB, against storing them as
written, in one run.

    python -m benchmarks.segment_codec [--mib 64] [--rounds 5]

A segment of `--mib` MiB of 1 KiB JSON events in uncompressed batches of 100 (as
producers without compression write them), and one of such records in lz4 batches. Per
transform (as written: read and CRC32C only; zstd; AES-256-GCM; both), one thread encodes
the whole log as a copy does (`ObjectEncoder`, 4 MiB chunks) and decodes every chunk as
reads do; CPU seconds per MiB (the thread's own) and the stored size. The best round
counts. Compression applies only to logs of mostly uncompressed batches, so the lz4 log
is never compressed: its row shows what encryption alone costs it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tierbroker.protocol.records import Compression, build_batch
from tierbroker.storage.remote.segment_codec import (
    KeyRing,
    ObjectEncoder,
    ObjectKind,
    SegmentTransform,
    TransformConfig,
    compressible,
)

MIB = 1 << 20
CHUNK = 4 * MIB
TRANSFORMS = {
    "as written": (False, False),
    "zstd": (True, False),
    "AES-256-GCM": (False, True),
    "zstd + AES-256-GCM": (True, True),
}


def write_log(path: Path, mib: int, compression: Compression) -> int:
    """A log of `mib` MiB of batches of 100 records of about 1 KiB: JSON events with random
    ids and a random text field, about as compressible as application events are."""
    rng = random.Random(7)
    words = [rng.randbytes(rng.randint(3, 9)).hex() for _ in range(2000)]
    offset = 0
    with open(path, "wb") as f:
        while f.tell() < mib * MIB:
            records = [
                (
                    b"user-%d" % rng.randrange(1_000_000),
                    json.dumps(
                        {
                            "id": str(uuid.UUID(int=rng.getrandbits(128))),
                            "event": rng.choice(("page_view", "click", "purchase", "search")),
                            "path": f"/items/{rng.randrange(10_000)}",
                            "price": round(rng.uniform(1, 500), 2),
                            "text": " ".join(rng.choices(words, k=60)),
                        }
                    ).encode(),
                    [],
                    1_700_000_000_000 + offset + i,
                )
                for i in range(100)
            ]
            f.write(build_batch(records, base_offset=offset, compression=compression))
            offset += 100
    return path.stat().st_size


def run(path: Path, size: int, compress: bool, encrypt: bool) -> dict[str, float]:
    keys = KeyRing({"k": os.urandom(32)}, "k" if encrypt else None)
    config = TransformConfig(chunk_bytes=CHUNK, compression=compress, keys=keys)
    fd = os.open(path, os.O_RDONLY)
    try:
        started = time.thread_time()
        segment = uuid.uuid4()
        transform = SegmentTransform.for_upload(
            segment, config, compress and compressible(fd, size)
        )
        encoder = ObjectEncoder(fd, size, transform, CHUNK)
        chunks = []
        while not encoder.done:
            chunks.append(encoder.read(CHUNK))
        encoded = time.thread_time() - started
    finally:
        os.close(fd)
    started = time.thread_time()
    if transform is not None:
        reader = SegmentTransform.for_read(
            segment, transform.format(CHUNK, encoder.chunk_sizes), keys
        )
        stored, at = b"".join(chunks), 0
        for index, length in enumerate(encoder.chunk_sizes):
            reader.decode(ObjectKind.LOG, index, stored[at : at + length])
            at += length
    decoded = time.thread_time() - started
    mib = size / MIB
    return {
        "encode_cpu_ms_per_mib": encoded * 1000 / mib,
        "decode_cpu_ms_per_mib": decoded * 1000 / mib,
        "stored_ratio": encoder.stored_bytes / size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-codec-") as workdir:
        for codec in (Compression.NONE, Compression.LZ4):
            path = Path(workdir) / f"{codec.name.lower()}.log"
            size = write_log(path, args.mib, codec)
            for name, (compress, encrypt) in TRANSFORMS.items():
                rounds = [run(path, size, compress, encrypt) for _ in range(args.rounds)]
                best = {k: min(r[k] for r in rounds) for k in rounds[0]}
                results[f"{codec.name.lower()} batches, {name}"] = best
    print(f"{'':40} {'encode CPU ms/MiB':>18} {'decode CPU ms/MiB':>18} {'stored/plain':>13}")
    for name, r in results.items():
        print(
            f"{name:40} {r['encode_cpu_ms_per_mib']:>18.2f} {r['decode_cpu_ms_per_mib']:>18.2f} "
            f"{r['stored_ratio']:>13.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
