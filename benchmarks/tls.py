"""Produce and consume over TLS against plaintext, on tierbroker and on Apache Kafka, in one
run: MiB/s and broker CPU seconds per MiB, and the ratios that matter (each broker's TLS
against its plaintext; tierbroker's TLS against Kafka's TLS).

    .venv/bin/python -m benchmarks.tls                          # about 3 minutes on 2 cores
    .venv/bin/python -m benchmarks.tls --mib 32 --rounds 1      # quick check

Each broker has a PLAINTEXT and an SSL listener (one-way TLS, certificates from
`tests.certs`, a PKCS12 key store both read); the client is confluent-kafka with the
workload of `benchmarks.throughput` (acks=1, 16 KiB values, no compression), checking the
broker's certificate and host name. A round, per broker (ABBA order across rounds) and per
listener, produces `--mib` MiB to a fresh topic of one partition, then consumes it. The
consume reads from segment files: plaintext is sent with sendfile, TLS is read with
pread a slice at a time and encrypted by OpenSSL in the broker's process. An untimed
warm-up round comes first (Kafka's JIT).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import workload
from benchmarks.phase import Phase
from benchmarks.targets import (
    KAFKA_JVM_OPTIONS,
    ROOT,
    Broker,
    free_port,
    require_apache_kafka,
    spawn,
    stop,
    tierbroker_command,
)
from tests.apache_kafka import ApacheKafka
from tests.certs import STORE_PASSWORD, Certificates, session_certs

NAMES = ("tierbroker", "apache-kafka")
PROTOCOLS = ("PLAINTEXT", "SSL")
VALUE_BYTES = 16384


def broker_ssl(certs: Certificates) -> dict[str, str]:
    return {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(certs.broker.p12),
        "ssl.keystore.password": STORE_PASSWORD,
    }


def client_ssl(certs: Certificates) -> dict[str, Any]:
    return {"security.protocol": "SSL", "ssl.ca.location": str(certs.ca.cert)}


def start_tierbroker(workdir: Path, certs: Certificates) -> tuple[Broker, dict[str, int]]:
    ports = {p: free_port() for p in PROTOCOLS}
    settings = {
        "listeners": ",".join(f"{p}://127.0.0.1:{port}" for p, port in ports.items()),
        "log.dirs": str(workdir / "data"),
        "metrics.port": str(free_port()),
        **broker_ssl(certs),
    }
    args = [tierbroker_command(), "serve", "--config", "config/server.properties"]
    for key, value in settings.items():
        args += ["--override", f"{key}={value}"]
    workdir.mkdir()
    return spawn("tierbroker", args, ports["PLAINTEXT"], workdir, cwd=ROOT), ports


def start_kafka(workdir: Path, certs: Certificates) -> tuple[Broker, dict[str, int]]:
    require_apache_kafka()
    kafka = ApacheKafka(workdir / "kafka", jvm_options=KAFKA_JVM_OPTIONS)
    ssl_port = free_port()
    kafka.properties = {
        "listeners": f"PLAINTEXT://127.0.0.1:{kafka.port},SSL://127.0.0.1:{ssl_port},"
        f"CONTROLLER://{kafka.controller}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{kafka.port},SSL://127.0.0.1:{ssl_port}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL",
        **broker_ssl(certs),
    }
    kafka.start()
    assert kafka.process is not None
    broker = Broker("apache-kafka", kafka.process, kafka.port, workdir, kafka.dir / "kafka.log")
    return broker, {"PLAINTEXT": kafka.port, "SSL": ssl_port}


def run_round(
    broker: Broker, ports: dict[str, int], tag: str, mib: int, certs: Certificates
) -> dict[str, Phase]:
    """Produce then consume over each listener: "PROTOCOL phase" -> phase."""
    value = os.urandom(VALUE_BYTES)
    count = mib * 2**20 // VALUE_BYTES
    phases = {}
    for protocol in PROTOCOLS:
        bootstrap = f"127.0.0.1:{ports[protocol]}"
        client = client_ssl(certs) if protocol == "SSL" else {}
        topic = f"tls-{protocol.lower()}-{tag}"
        workload.create_topic(f"127.0.0.1:{ports['PLAINTEXT']}", topic)
        cpu = broker.cpu_seconds
        phases[f"{protocol} produce"] = workload.produce(
            bootstrap, topic, value, count, cpu, client
        )
        phases[f"{protocol} consume"] = workload.consume(
            bootstrap, topic, count, VALUE_BYTES, cpu, client
        )
    return phases


def median(phases: list[Phase], measure: str) -> float:
    if measure == "mib_per_s":
        return statistics.median(p.mib_per_s for p in phases)
    return statistics.median((p.broker_cpu_s or 0.0) / (p.payload_bytes / 2**20) for p in phases)


def report(rounds: dict[str, list[dict[str, Phase]]]) -> list[str]:
    lines = ["", f"{'':<20}{'MiB/s':>22}{'broker CPU s/MiB':>26}"]
    lines.append(f"{'':<20}{'tierbroker':>12}{'kafka':>10}{'tierbroker':>14}{'kafka':>12}")
    for key in rounds["tierbroker"][0]:
        values = [
            median([r[key] for r in rounds[name]], m)
            for m in ("mib_per_s", "cpu_s_per_mib")
            for name in NAMES
        ]
        lines.append(
            f"{key:<20}{values[0]:>12.1f}{values[1]:>10.1f}{values[2]:>14.4f}{values[3]:>12.4f}"
        )
    lines.append("")
    for phase in ("produce", "consume"):
        rate = {
            (name, p): median([r[f"{p} {phase}"] for r in rounds[name]], "mib_per_s")
            for name in NAMES
            for p in PROTOCOLS
        }
        ours = rate["tierbroker", "SSL"] / rate["tierbroker", "PLAINTEXT"]
        theirs = rate["apache-kafka", "SSL"] / rate["apache-kafka", "PLAINTEXT"]
        versus = rate["tierbroker", "SSL"] / rate["apache-kafka", "SSL"]
        lines.append(
            f"{phase}: TLS / plaintext  tierbroker {ours:.2f}x  kafka {theirs:.2f}x;  "
            f"tierbroker TLS / kafka TLS {versus:.2f}x"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB produced and consumed per phase")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds after the warm-up")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    certs = session_certs()
    workdir = Path(tempfile.mkdtemp(prefix="bench-tls-"))
    started: dict[str, tuple[Broker, dict[str, int]]] = {}
    try:
        started["tierbroker"] = start_tierbroker(workdir / "tierbroker", certs)
        started["apache-kafka"] = start_kafka(workdir / "kafka", certs)
        rounds: dict[str, list[dict[str, Phase]]] = {name: [] for name in NAMES}
        for round_ in range(args.rounds + 1):  # round 0: the warm-up
            for name in NAMES if round_ % 2 else NAMES[::-1]:
                broker, ports = started[name]
                phases = run_round(broker, ports, str(round_), args.mib, certs)
                if round_ > 0:
                    rounds[name].append(phases)
                shown = ", ".join(f"{k} {v.mib_per_s:.0f}" for k, v in phases.items())
                warm_up = " (warm-up)" if not round_ else ""
                print(f"round {round_}{warm_up} {name}: {shown}", flush=True)
    finally:
        for broker, _ in started.values():
            stop(broker)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{args.mib} MiB of {VALUE_BYTES}-byte values per phase, {args.rounds} rounds")
    print("\n".join(report(rounds)))


if __name__ == "__main__":
    main()
