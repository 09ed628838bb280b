"""The README's shell examples run as written, against a broker started with the shipped
config; only its ports differ (9092 and 9404 are `make run`'s), so nothing collides.
The examples that start brokers run as written too, their data in a temp dir instead of
/tmp and, where they name fixed ports, on free ones."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from tests.integration.broker_process import (
    ROOT,
    BrokerProcess,
    api_versions_answered,
    executable,
    free_ports,
)
from tests.integration.waiting import wait_for
from tests.zookeeper import ZooKeeperServer

README = ROOT / "README.md"


def sh_blocks(heading: str) -> list[str]:
    """The ```sh blocks under `heading` (a line of the README), up to the next heading."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    following = re.search(r"\n#{1,6} ", text[start + len(heading) + 2 :])
    end = start + len(heading) + 2 + following.start() if following else len(text)
    return re.findall(r"```sh\n(.*?)```", text[start:end], flags=re.DOTALL)


def as_here(block: str, cwd: Path) -> str:
    """`block` with this virtualenv's commands, and `cwd` for /tmp."""
    venv_bin = f"{Path(sys.executable).parent}/"
    # /tmp first: the virtualenv itself may live under /tmp.
    return block.replace("/tmp/", f"{cwd}/").replace(".venv/bin/", venv_bin)


def environment(broker: BrokerProcess | None) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # the venv's commands
        "HYPOTHESIS_STORAGE_DIRECTORY": str(ROOT / ".hypothesis"),
    }
    if broker is not None:  # where the README's commands default to 9092
        env["TIERBROKER_BOOTSTRAP"] = broker.bootstrap
    return env


def run(
    block: str, broker: BrokerProcess | None, cwd: Path, bootstrap: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`block` in bash, stopping at the first failure, with the broker's ports in it, or
    with `bootstrap` for the cluster the README runs on 127.0.0.1:19092."""
    script = as_here(block, cwd)
    if broker is not None:
        script = script.replace("127.0.0.1:9092", broker.bootstrap).replace(
            "127.0.0.1:9404", f"127.0.0.1:{broker.metrics_port}"
        )
    if bootstrap is not None:
        script = script.replace("127.0.0.1:19092", bootstrap)
    executable("kcat", "apt-get install kcat")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=environment(broker),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{script}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


def on_free_ports(script: str) -> tuple[str, int]:
    """`script` with its listener and metrics ports free ones (three in a row each, for
    `--brokers 3`); and the listener's."""
    port = free_ports(3)
    script = re.sub(r"(PLAINTEXT://127\.0\.0\.1:)\d+", rf"\g<1>{port}", script)
    return re.sub(r"metrics\.port=\d+", f"metrics.port={free_ports(3)}", script), port


def run_serve(
    block: str,
    cwd: Path,
    meanwhile: Callable[[str], None] | None = None,
    zookeeper: str = "127.0.0.1:2181",
) -> str:
    """A block that runs brokers in the foreground: run it, on free ports (and the given
    ZooKeeper), until it answers; `meanwhile` gets its bootstrap; stop it with SIGTERM;
    its stderr (it must have exited 0)."""
    script, port = on_free_ports(as_here(block, cwd).replace("127.0.0.1:2181", zookeeper))
    bootstrap = f"127.0.0.1:{port}"
    with open(cwd / "serve.log", "w+") as log:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {script}"], cwd=cwd, env=environment(None), stderr=log
        )
        try:
            while not api_versions_answered(port):
                assert process.poll() is None, f"{script}\n{Path(log.name).read_text()}"
            cluster = subprocess.run(
                ["tierbroker", "cluster", "info", "-b", bootstrap],
                env=environment(None),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert cluster.returncode == 0, cluster.stderr
            if meanwhile is not None:
                meanwhile(bootstrap)
        finally:
            process.send_signal(signal.SIGTERM)
            status = process.wait(60)
        logged = Path(log.name).read_text()
        assert status == 0, logged[-4000:]
        return logged


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("readme")).start()
    yield b
    b.kill()


@pytest.mark.parametrize("heading", ["## Quick start", "## Development"])
def test_the_make_targets(heading: str) -> None:
    """The `make` lines, dry-run: each target exists, and `make run` serves the shipped
    config (its broker on 9092 would meet a developer's; the suite is `make test` itself)."""
    block = sh_blocks(heading)[0]
    targets = re.findall(r"^make (\S+)", block, flags=re.MULTILINE)
    assert targets, block
    # as from a shell: not as a sub-make of `make test`, which would print its directories
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    for target in targets:
        dry = subprocess.run(
            ["make", "-n", target], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert dry.returncode == 0, f"make -n {target}: {dry.stderr}"
        if target == "run":
            assert dry.stdout.splitlines()[-1] == (
                ".venv/bin/tierbroker serve --config config/server.properties"
            )


def test_quick_start(broker: BrokerProcess, tmp_path: Path) -> None:
    _, produce_consume = sh_blocks("## Quick start")
    assert run(produce_consume, broker, tmp_path).stdout.splitlines() == ["hello"]


def test_running_a_broker(tmp_path: Path) -> None:
    second, free_ports = sh_blocks("## Running a broker")
    assert "Traceback" not in run_serve(second, tmp_path)
    assert (tmp_path / "tierbroker-19092" / "remote").is_dir()  # tiering, by default
    [ports] = json.loads(run(free_ports, None, tmp_path).stdout)
    assert ports["broker_id"] == 0 and ports["host"] == "127.0.0.1"
    assert ports["port"] > 0 and ports["metrics_port"] > 0
    assert not (tmp_path / "tierbroker-free.json").exists()  # removed on exit


def test_the_request_log(tmp_path: Path) -> None:
    (block,) = sh_blocks("### Logs")
    logged = run_serve(block, tmp_path)
    assert "DEBUG tierbroker.request: Completed request: Metadata v" in logged


def test_the_demo(tmp_path: Path) -> None:
    (block,) = sh_blocks("## See it work: `tierbroker demo`")
    shown = run(block, None, tmp_path).stdout
    for part in ("3 brokers in racks a, b, c started", "where the bytes are", "same-rack reads"):
        assert part in shown
    assert "Traceback" not in shown


def test_everyday_commands(broker: BrokerProcess, tmp_path: Path) -> None:
    (block,) = sh_blocks("## Everyday commands")
    out = run(block, broker, tmp_path).stdout
    assert "k1:hello\tsource=cli" in out


def test_acls(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n### ACLs\n") :]
    (properties,) = re.findall(r"```properties\n(.*?)```", section, flags=re.DOTALL)[:1]
    settings = dict(line.split("=", 1) for line in properties.splitlines())
    secured = BrokerProcess(tmp_path, settings).start()
    try:
        (block,) = sh_blocks("### ACLs")
        out = run(block, secured, tmp_path).stdout
    finally:
        secured.kill()
    assert "User:bob" in out and "User:alice" in out


def test_tiered_storage(broker: BrokerProcess, tmp_path: Path) -> None:
    (block,) = sh_blocks("### Tiered storage")
    out = run(block, broker, tmp_path).stdout
    assert "RemoteLogSizeBytes" in out


def test_a_cluster_in_one_process_moves_a_partition(tmp_path: Path) -> None:
    in_one_process, _ = sh_blocks("## A cluster")
    (moving,) = sh_blocks("### Moving partitions")

    def move(bootstrap: str) -> None:
        elected = run(moving, None, tmp_path, bootstrap).stdout
        assert re.search(r"payments:0\s+2,1,0\s+2,1,0\s+complete", elected), elected

        def described() -> dict[str, Any]:
            shown = subprocess.run(
                ["tierbroker", "topic", "describe", "payments", "-b", bootstrap, "-o", "json"],
                env=environment(None),
                capture_output=True,
                text=True,
                timeout=60,
            )
            [partition] = json.loads(shown.stdout)["partitions"]
            return dict(partition)

        # the broker asked may learn of the election a moment after it is made
        wait_for(lambda: described()["leader"] == 2, "broker 2 to lead payments")
        assert described()["replicas"] == [2, 1, 0]

    logged = run_serve(in_one_process, tmp_path, move)
    assert "Traceback" not in logged
    assert {f"[broker {i}]" for i in range(3)} <= set(re.findall(r"\[broker \d\]", logged))


def test_a_cluster_over_zookeeper(tmp_path: Path) -> None:
    _, over_zookeeper = sh_blocks("## A cluster")
    zookeeper = ZooKeeperServer(tmp_path / "zookeeper").start()
    registered: list[str] = []

    def look(_bootstrap: str) -> None:
        client = KazooClient(hosts=zookeeper.connect)
        client.start(timeout=30)
        try:
            registered.extend(client.get_children("/tierbroker/brokers/ids"))
        finally:
            client.stop()
            client.close()

    try:
        logged = run_serve(over_zookeeper, tmp_path, look, zookeeper=zookeeper.connect)
    finally:
        zookeeper.stop()
    assert "Traceback" not in logged
    assert registered == ["1"]  # in Kafka's layout, under the chroot it created


def test_fetching_from_the_closest_replica(tmp_path: Path) -> None:
    (racked,) = sh_blocks("### Fetching from the closest replica")
    logged = run_serve(racked, tmp_path)
    assert "Traceback" not in logged
    assert {f"[broker {i}]" for i in range(3)} <= set(re.findall(r"\[broker \d\]", logged))


def test_the_backfill_example(tmp_path: Path) -> None:
    """The TieredConsumer example as printed, against a broker of its own (remote-log
    tasks every 200 ms instead of 30 s) and that broker's remote tier."""
    text = README.read_text(encoding="utf-8")
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "backfill" in b]
    broker = BrokerProcess(
        tmp_path / "broker", overrides={"remote.log.manager.task.interval.ms": "200"}
    )
    (tmp_path / "broker").mkdir()
    broker.start()
    try:
        run(
            "tierbroker topic create orders --config remote.storage.enable=true "
            "--config segment.bytes=1024\n"
            "for i in 1 2 3 4 5; do seq 1 40 | tierbroker produce orders; done\n",
            broker,
            tmp_path,
        )

        def tiered() -> int:
            status = run("tierbroker tier status --topic orders --output json", broker, tmp_path)
            return sum(p["remote_segments"] for p in json.loads(status.stdout)["partitions"])

        wait_for(tiered, "segments of orders in the remote tier", timeout_s=60)
        remote = (broker.data_dir / "logs" / "remote").as_uri()
        script = example.replace("file:///tmp/tierbroker-logs/remote", remote).replace(
            "127.0.0.1:9092", broker.bootstrap
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
    finally:
        broker.stop()
    assert done.returncode == 0, done.stderr
    (counted,) = re.findall(r"^(\d+) records$", done.stdout, re.M)
    # a batch a run, a segment each: what the closed segments copied by then hold
    assert int(counted) in (40, 80, 120, 160)
