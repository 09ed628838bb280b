"""The machine's ceiling: how fast can bytes go over loopback into a file and back out?

produce: a uvloop server reads size-prefixed frames and appends each frame to a file,
         answering nothing; a plain blocking client sends the payload in frames the size
         of the producer's Produce requests, then half-closes and waits for the server's EOF.
consume: a server on the stock asyncio loop (uvloop has no sendfile) sends that file back
         with loop.sendfile(); the client reads it to the end.

The servers run as subprocesses (`python -m benchmarks.ceiling produce-server|consume-server
PORT FILE`), so, like a broker, they have their own process and CPU clock.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from benchmarks.phase import Phase
from benchmarks.targets import ROOT, process_cpu_seconds

# --- servers (run in a subprocess) ---


class FrameAppender(asyncio.BufferedProtocol):
    """Reads size-prefixed frames straight into one buffer and appends each to `out`.

    (asyncio streams are much slower here: with their 64 KiB default limit they pause
    reading on every 1 MB frame and copy each frame twice; a broker would not use them.)
    """

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.buffer = bytearray(8 * 1024 * 1024)  # larger than any frame we send
        self.view = memoryview(self.buffer)
        self.used = 0

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.used :]

    def buffer_updated(self, nbytes: int) -> None:
        self.used += nbytes
        start = 0
        while self.used - start >= 4:
            (size,) = struct.unpack_from(">i", self.buffer, start)
            if self.used - start - 4 < size:
                break
            self.out.write(self.view[start + 4 : start + 4 + size])
            start += 4 + size
        if start:  # keep the partial frame at the front
            self.buffer[: self.used - start] = self.buffer[start : self.used]
            self.used -= start

    def eof_received(self) -> bool:  # the client half-closed: all sent
        self.out.flush()
        return False  # close our side too; the client waits for that


async def produce_server(port: int, out: BinaryIO) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FrameAppender(out), "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


async def consume_server(port: int, log: BinaryIO) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await reader.read(1):  # one byte asks for the file; a bare connect gets nothing
            await asyncio.get_running_loop().sendfile(writer.transport, log, offset=0)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


# --- clients (run in the harness) ---


@contextmanager
def server_process(kind: str, path: Path) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    args = [sys.executable, "-m", "benchmarks.ceiling", kind, str(port), str(path)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"ceiling {kind} did not start (exit code {process.wait()})")
        yield port, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def send_frames(port: int, total: int, frame_size: int) -> None:
    """Send `total` payload bytes in frames of `frame_size`, then wait for the server's EOF."""
    payload = bytes(frame_size)
    full_frame = struct.pack(">i", frame_size) + payload
    with socket.create_connection(("127.0.0.1", port)) as s:
        left = total
        while left >= frame_size:
            s.sendall(full_frame)
            left -= frame_size
        if left:
            s.sendall(struct.pack(">i", left) + payload[:left])
        s.shutdown(socket.SHUT_WR)
        while s.recv(1):
            pass


def read_all(port: int) -> int:
    buffer = bytearray(1024 * 1024)
    received = 0
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"g")
        while n := s.recv_into(buffer):
            received += n
    return received


def measure_once(total: int, messages: int, frame_size: int) -> tuple[Phase, Phase]:
    """The produce and consume ceilings for `total` payload bytes (`messages` for msgs/s)."""
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-") as tmp:
        path = Path(tmp) / "log"
        with server_process("produce-server", path) as (port, process):
            cpu = process_cpu_seconds(process.pid)
            started = time.perf_counter()
            send_frames(port, total, frame_size)
            seconds = time.perf_counter() - started
            produce = Phase(messages, total, seconds, process_cpu_seconds(process.pid) - cpu)
        produce.extra["avg_request_bytes"] = frame_size
        if path.stat().st_size != total:
            raise RuntimeError(f"produce ceiling wrote {path.stat().st_size} B, not {total}")
        with server_process("consume-server", path) as (port, process):
            cpu = process_cpu_seconds(process.pid)
            started = time.perf_counter()
            received = read_all(port)
            seconds = time.perf_counter() - started
            consume = Phase(messages, received, seconds, process_cpu_seconds(process.pid) - cpu)
        if received != total:
            raise RuntimeError(f"consume ceiling read {received} B, not {total}")
    return produce, consume


def measure(total: int, messages: int, frame_size: int, repeat: int = 3) -> tuple[Phase, Phase]:
    """The best of `repeat` runs per phase: a ceiling is an upper bound; loopback is noisy."""
    runs = [measure_once(total, messages, frame_size) for _ in range(repeat)]
    produce = min((run[0] for run in runs), key=lambda phase: phase.seconds)
    consume = min((run[1] for run in runs), key=lambda phase: phase.seconds)
    return produce, consume


def main() -> None:
    parser = argparse.ArgumentParser(description="a ceiling server (see benchmarks/ceiling.py)")
    parser.add_argument("kind", choices=["produce-server", "consume-server"])
    parser.add_argument("port", type=int)
    parser.add_argument("path", type=Path)
    args = parser.parse_args()
    if args.kind == "produce-server":
        import uvloop

        with open(args.path, "ab") as out:
            uvloop.run(produce_server(args.port, out))
    else:
        with open(args.path, "rb") as log:
            asyncio.run(consume_server(args.port, log))


if __name__ == "__main__":
    main()
