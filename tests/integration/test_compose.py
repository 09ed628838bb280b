"""docker-compose.yml, without a Docker engine.

- The file validates against the Compose specification's JSON schema (the copy that
  check-jsonschema ships from the compose-spec project), and says what the topology
  needs: three brokers in racks a, b and c built from the Dockerfile, waiting for
  ZooKeeper and for the bucket the MinIO client creates, tiering to that bucket,
  fetching from the closest replica, each with its metrics port published.
- The same topology runs here as processes: each broker service's own command,
  environment and mounted config file, with Docker's networking replaced by one
  translation (a service's name and port, or 0.0.0.0 and a published port, become
  127.0.0.1 and a free port; container paths become temp dirs). A real ZooKeeper
  stands for the zookeeper service and moto's S3 server for MinIO, with the bucket the
  minio-bucket service creates. The README's commands run in the services create the
  topic and show its tiers; records produced through it are read back by a consumer in
  rack b from the broker in rack b, and reach the bucket.
- The Dockerfile copies every layer of the package.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from tests.integration.broker_process import ROOT, api_versions_answered, executable, free_port
from tests.integration.moto_server import MotoServer
from tests.zookeeper import ZooKeeperServer

COMPOSE = ROOT / "docker-compose.yml"
BROKERS = {"broker-a": "a", "broker-b": "b", "broker-c": "c"}


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def bucket_created(spec: dict[str, Any]) -> str:
    """The bucket the minio-bucket service makes (`mc mb ... <alias>/<bucket>`)."""
    script = " ".join(spec["services"]["minio-bucket"]["command"])
    found = re.search(r"mc mb (?:--\S+ )*\w+/([a-z0-9.-]+)", script)
    assert found, script
    return found.group(1)


def properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs if not k.lstrip().startswith("#")}


def overrides(command: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--override=").split("=", 1) for a in command if "--override=" in a)


# The file --------------------------------------------------------------------------------


def test_the_compose_file_follows_the_specification_and_the_topology() -> None:
    schema = json.loads(
        resources.files("check_jsonschema.builtin_schemas.vendor")
        .joinpath("compose-spec.json")
        .read_text()
    )
    assert schema["title"] == "Compose Specification"
    spec = compose()
    jsonschema.validators.validator_for(schema)(schema).validate(spec)

    services = spec["services"]
    assert {"zookeeper", "minio", "minio-bucket", *BROKERS} <= set(services)
    bucket = bucket_created(spec)
    published: set[str] = set()
    broker_ids: set[str] = set()
    for name, rack in BROKERS.items():
        service = services[name]
        assert service["build"] == "."
        assert service["depends_on"]["zookeeper"]["condition"] == "service_healthy"
        assert (
            service["depends_on"]["minio-bucket"]["condition"] == "service_completed_successfully"
        )
        mounted = dict(v.split(":")[:2] for v in service["volumes"] if v.startswith("./"))
        command = service["command"]
        (config_arg,) = [a for a in command if a.startswith("--config=")]
        host_file = next(h for h, c in mounted.items() if c == config_arg.split("=", 1)[1])
        settings = {**properties((ROOT / host_file).read_text()), **overrides(command)}
        assert settings["broker.rack"] == rack
        assert settings["metadata.store"] == "zookeeper"
        assert settings["zookeeper.connect"].startswith("zookeeper:2181")
        assert settings["replica.selector.class"].endswith("RackAwareReplicaSelector")
        assert settings["remote.log.storage.system.enable"] == "true"
        assert settings["remote.log.storage.manager.class.name"] == "s3"
        assert settings["rsm.config.storage.s3.bucket.name"] == bucket
        assert settings["rsm.config.storage.s3.endpoint.url"] == "http://minio:9000"
        advertised = settings["advertised.listeners"].removeprefix("PLAINTEXT://")
        assert advertised.split(":")[0] == name
        ports = {p.split(":")[1] for p in service["ports"]}
        assert {advertised.split(":")[1], settings["metrics.port"]} == ports
        published |= ports
        broker_ids.add(settings["broker.id"])
    assert len(broker_ids) == 3
    assert len(published) == 6  # every broker's ports its own, on the host too


def test_the_dockerfile_copies_every_layer() -> None:
    copied = {
        source
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for source in line.split()[1:-1]
    }
    setup = ast.parse((ROOT / "setup.py").read_text())
    (layers,) = [
        ast.literal_eval(node.value)
        for node in setup.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "LAYERS"
    ]
    assert layers and set(layers) <= copied
    assert {"tierbroker", "pyproject.toml", "setup.py", "README.md"} <= copied


# The topology, as processes ------------------------------------------------------------


class Translation:
    """Docker's networking and volumes, as one process host sees them."""

    def __init__(self, spec: dict[str, Any], zookeeper: str, s3: str, directory: Path) -> None:
        self.addresses = {("zookeeper", 2181): zookeeper, ("minio", 9000): s3}
        for name in BROKERS:  # their ports are distinct, on the host as in their containers
            for mapping in spec["services"][name]["ports"]:
                port = int(mapping.split(":")[-1])
                free = f"127.0.0.1:{free_port()}"
                for host in (name, "0.0.0.0", "localhost"):
                    self.addresses[host, port] = free
        self.directory = directory

    def text(self, value: str, paths: dict[str, str]) -> str:
        def address(found: re.Match[str]) -> str:
            return self.addresses.get((found.group(1), int(found.group(2))), found.group(0))

        value = re.sub(r"([A-Za-z0-9.-]+):(\d+)", address, value)
        value = re.sub(
            r"metrics\.port=(\d+)",
            lambda m: "metrics.port=" + self.addresses["0.0.0.0", int(m.group(1))].split(":")[1],
            value,
        )
        for container, host in paths.items():
            value = value.replace(container, host)
        return value

    def service(self, name: str, service: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """The command and environment of a service, as a process here runs them."""
        paths: dict[str, str] = {}
        for volume in service["volumes"]:
            source, target = volume.split(":")[:2]
            if source.startswith("./"):  # a file of the repository, its addresses translated
                copy = self.directory / name / Path(source).name
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_text(self.text((ROOT / source).read_text(), {}))
                paths[target] = str(copy)
            else:  # a named volume: a directory of its own
                paths[target] = str(self.directory / name / source)
        for container, host in list(paths.items()):  # in the files too
            for file in (self.directory / name).glob("*"):
                if file.is_file():
                    file.write_text(file.read_text().replace(container, host))
        command = [self.text(arg, paths) for arg in service["command"]]
        environment = {k: self.text(str(v), paths) for k, v in service["environment"].items()}
        return command, environment


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("compose")
    spec = compose()
    zookeeper = ZooKeeperServer(directory / "zookeeper").start()
    moto = MotoServer().start()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        bucket = bucket_created(spec)
        moto.create_bucket(bucket)
        translate = Translation(
            spec, zookeeper.connect, f"127.0.0.1:{moto.port}", directory / "services"
        )
        brokers = {}
        for name in BROKERS:
            command, environment = translate.service(name, spec["services"][name])
            assert command[0] == "tierbroker", shlex.join(command)
            command[0] = executable("tierbroker", "pip install -e .")
            with open(directory / f"{name}.log", "wb") as log:
                processes.append(
                    subprocess.Popen(
                        command,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, **environment},
                    )
                )
            settings = overrides(command)
            brokers[name] = {
                "address": settings["advertised.listeners"].removeprefix("PLAINTEXT://"),
                "metrics": int(settings["metrics.port"]),
                "id": int(settings["broker.id"]),
            }
        for name, broker in brokers.items():
            port = int(broker["address"].split(":")[1])
            wait_for(lambda p=port: api_versions_answered(p), f"{name} answering", directory)
        yield {
            "brokers": brokers,
            "bucket": bucket,
            "moto": moto,
            "directory": directory,
            "translate": translate,
        }
    finally:
        for process in processes:  # one after another, as a rolling stop: each hands over
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        moto.stop()
        zookeeper.stop()


def wait_for(
    condition: Callable[[], bool], what: str, directory: Path, timeout_s: float = 60
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                for p in sorted(directory.glob("broker-*.log"))
            )
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.1)


def consumer_bytes(metrics_port: int, topic: str) -> dict[str, float]:
    """A broker's `ConsumerBytesOut` for the topic, by locality, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ConsumerBytesOut_total{") and f'topic="{topic}"' in line:
            locality = re.search(r'locality="([a-z-]+)"', line)
            assert locality is not None, line
            totals[locality.group(1)] = totals.get(locality.group(1), 0.0) + float(line.split()[-1])
    return totals


def readme_commands() -> list[str]:
    """The README's commands run inside the compose services (`docker compose exec`)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## On a laptop: docker compose") :]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)[:1]
    commands = block.replace("\\\n", " ").splitlines()
    return [c for c in commands if c.startswith("docker compose exec")]


def run_in_service(command: str, translate: Translation) -> str:
    """A README `docker compose exec SERVICE tierbroker ...` line, run as the service
    would: its names and ports translated as the topology's are."""
    words = shlex.split(command)
    assert words[:3] == ["docker", "compose", "exec"] and words[4] == "tierbroker", command
    args = [
        executable("tierbroker", "pip install -e ."),
        *(translate.text(a, {}) for a in words[5:]),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    return done.stdout


def test_records_go_through_the_topology_and_tier_to_the_bucket(topology: dict[str, Any]) -> None:
    brokers = topology["brokers"]
    bootstrap = ",".join(b["address"] for b in brokers.values())
    create, status = readme_commands()
    run_in_service(create, topology["translate"])  # the README's topic: 1 MiB segments, tiered
    producer = Producer(  # in order, to one partition; more than a segment, so one rolls
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "enable.idempotence": True,
        }
    )
    values = [b"click-%d:" % i + b"." * 200 for i in range(6000)]
    for value in values:
        producer.produce("clicks", value, partition=0)
        producer.poll(0)
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "compose-reader",
            "client.rack": "b",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition("clicks", 0, OFFSET_BEGINNING)])
    read: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(read) < len(values) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read.append(message.value())
    consumer.close()
    assert read == values

    served = {name: consumer_bytes(b["metrics"], "clicks") for name, b in brokers.items()}
    assert served["broker-b"].get("same-rack", 0) >= sum(len(v) for v in values)
    assert not served["broker-a"] and not served["broker-c"]

    s3 = topology["moto"].client()
    wait_for(
        lambda: any(
            o["Key"].endswith(".log")
            for o in s3.list_objects_v2(Bucket=topology["bucket"]).get("Contents", [])
        ),
        "a segment in the bucket",
        topology["directory"],
    )
    assert "clicks" in run_in_service(status, topology["translate"])
