"""moto's standalone S3 server, started as a subprocess on a free loopback port.

The tests talk HTTP to it, exactly as the broker talks to S3; nothing is patched
in-process. `restart()` stops and starts it on the same port (an outage);
the bucket must then be created again (moto keeps state in memory).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.integration.broker_process import executable, free_port

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
REGION = "us-east-1"


class MotoServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20) -> MotoServer:
        moto = executable("moto_server", 'pip install "moto[server]"')
        args = [moto, "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on port {self.port}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self) -> object:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, **CREDENTIALS)

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]

    def rsm_overrides(self, bucket: str) -> dict[str, str]:
        """Broker properties that point the S3 plugin at this server."""
        return {
            "remote.log.storage.manager.class.name": "s3",
            "rsm.config.storage.s3.bucket.name": bucket,
            "rsm.config.storage.s3.region": REGION,
            "rsm.config.storage.s3.endpoint.url": self.endpoint,
            "rsm.config.storage.s3.path.style.access.enabled": "true",
            "rsm.config.storage.aws.access.key.id": CREDENTIALS["aws_access_key_id"],
            "rsm.config.storage.aws.secret.access.key": CREDENTIALS["aws_secret_access_key"],
        }


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    server = MotoServer().start()
    yield server
    server.stop()
