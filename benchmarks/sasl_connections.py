"""Connections per second through SCRAM-SHA-512 against plaintext ones, on one broker.

One `tierbroker serve` process with a PLAINTEXT and a SASL_PLAINTEXT listener. A client
opens connections, `--concurrency` at a time, each doing what a client does before its
first real request: ApiVersions, then (SCRAM) SaslHandshake v1 and the two
SaslAuthenticate round trips, then a Metadata request; then it closes. Rounds alternate
the two listeners; the medians of connections per second and of the broker's CPU per
connection are reported, and their ratio. The client's Hi(password) (4096 rounds of
PBKDF2, the client's cost by design) is computed once, so the broker's cost is measured.

    python -m benchmarks.sasl_connections                  # about half a minute
    python -m benchmarks.sasl_connections --connections 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.targets import ROOT, Broker, free_port, spawn, stop, tierbroker_command
from tierbroker.broker.security.sasl.scram import ScramMechanism
from tierbroker.broker.security.sasl.scram_client import ScramSaslClient
from tierbroker.protocol.client_codec import decode_response, encode_request, request_type

SHA512 = ScramMechanism.SCRAM_SHA_512
USER, PASSWORD = "bench", "bench-pw"


def start(workdir: Path) -> tuple[Broker, int]:
    plain, sasl = free_port(), free_port()
    settings = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "log.dirs": str(workdir / "data"),
        "metrics.port": str(free_port()),
        "max.connections.per.ip": "100000",
    }
    args = [tierbroker_command(), "serve", "--config", "config/server.properties"]
    for key, value in settings.items():
        args += ["--override", f"{key}={value}"]
    return spawn("tierbroker", args, plain, workdir, cwd=ROOT), sasl


def add_user(bootstrap: str) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        UserScramCredentialUpsertion,
    )
    from confluent_kafka.admin import ScramMechanism as ClientMechanism

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    info = ScramCredentialInfo(ClientMechanism.SCRAM_SHA_512, 4096)
    upsertion = UserScramCredentialUpsertion(USER, info, PASSWORD.encode())
    admin.alter_user_scram_credentials([upsertion])[USER].result(30)


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.correlation_id = 0

    async def request(self, api_key: int, version: int, **fields: Any) -> Any:
        self.correlation_id += 1
        body = request_type(api_key, version)(**fields)
        self.writer.write(encode_request(self.correlation_id, "bench", body))
        (size,) = struct.unpack(">i", await self.reader.readexactly(4))
        return decode_response(api_key, version, await self.reader.readexactly(size))


async def one_connection(port: int, scram: bool) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        connection = Connection(reader, writer)
        await connection.request(18, 0)
        if scram:
            await connection.request(17, 1, mechanism=SHA512.mechanism_name)
            client = ScramSaslClient(SHA512, USER, PASSWORD)
            first = await connection.request(36, 2, auth_bytes=client.first_message())
            final = client.final_message(bytes(first.auth_bytes))
            answer = await connection.request(36, 2, auth_bytes=final)
            assert answer.error_code.value == 0, answer.error_message
            client.verify(bytes(answer.auth_bytes))
        await connection.request(3, 1, topics=())
    finally:
        writer.close()
        await writer.wait_closed()


async def connections_per_s(port: int, scram: bool, count: int, concurrency: int) -> float:
    remaining = iter(range(count))

    async def worker() -> None:
        for _ in remaining:
            await one_connection(port, scram)

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # The client's PBKDF2 is not the broker's work: computed once per salt.
    SHA512.__class__.salted_password = functools.cache(SHA512.__class__.salted_password)  # type: ignore[method-assign]
    workdir = Path(tempfile.mkdtemp(prefix="bench-sasl-"))
    broker, sasl_port = start(workdir)
    try:
        add_user(broker.bootstrap)
        results: dict[str, list[tuple[float, float]]] = {"plaintext": [], "SCRAM-SHA-512": []}
        for _ in range(args.rounds):
            for name, port, scram in (
                ("plaintext", broker.port, False),
                ("SCRAM-SHA-512", sasl_port, True),
            ):
                cpu_before = broker.cpu_seconds()
                rate = asyncio.run(
                    connections_per_s(port, scram, args.connections, args.concurrency)
                )
                cpu_ms = (broker.cpu_seconds() - cpu_before) * 1000 / args.connections
                results[name].append((rate, cpu_ms))
    finally:
        stop(broker)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.connections} connections, {args.concurrency} at a time, {args.rounds} rounds")
    print(f"{'listener':<16}{'connections/s':>16}{'broker CPU ms/conn':>22}")
    medians = {}
    for name, samples in results.items():
        rate = statistics.median(r for r, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        medians[name] = (rate, cpu)
        print(f"{name:<16}{rate:>16.0f}{cpu:>22.3f}")
    (plain_rate, plain_cpu), (scram_rate, scram_cpu) = medians.values()
    print(f"SCRAM / plaintext: {scram_rate / plain_rate:.2f}x the rate, "
          f"{scram_cpu / plain_cpu:.2f}x the broker CPU per connection")  # fmt: skip


if __name__ == "__main__":
    main()
