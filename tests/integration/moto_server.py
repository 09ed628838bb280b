"""moto's standalone S3 server, started as a subprocess on a free loopback port.

The tests talk HTTP to it, exactly as the broker talks to S3; nothing is patched
in-process. `restart()` stops and starts it on the same port (an outage); moto
keeps its state in memory, so buckets must then be created again. `requests()` reads
its request log: the access line its HTTP server writes on stderr for every request.

Fixtures: `moto_endpoint` (one server per test module, its URL) and `moto` (a
fresh `MotoServer` per test, for tests that stop or restart it). Import them into
a test module to use them. `FaultyClient` wraps the plugin's S3 clients to record
calls and inject faults; `InstrumentedS3` is the plugin with that wrapper.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import re
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from botocore.exceptions import ClientError

from tests.integration.broker_process import executable, free_port
from tierbroker.storage.remote.s3 import S3RemoteStorageManager

REPO = Path(__file__).resolve().parents[2]
_REQUEST_LINE = re.compile(r"^moto-request ([A-Z]+) (\S+)$", re.MULTILINE)
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
REGION = "us-east-1"


class MotoServer:
    """`latency_ms` > 0: every request is answered that much later (an object store's
    round trip; concurrent requests wait together, as they would on a real endpoint).
    `tls`: (certificate chain, key) PEM files: served over HTTPS with that chain, which
    the test clients trust."""

    def __init__(
        self, port: int | None = None, latency_ms: int = 0, tls: tuple[Path, Path] | None = None
    ) -> None:
        self.port = free_port() if port is None else port
        self.latency_ms = latency_ms
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20) -> MotoServer:
        """Start `moto_server` and wait until it answers HTTP."""
        executable("moto_server", 'pip install "moto[server]"')
        command = [sys.executable, "-m", "tests.integration.moto_server", str(self.latency_ms)]
        if self.tls is not None:
            command += ["-c", str(self.tls[0]), "-k", str(self.tls[1])]
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [*command, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            cwd=REPO,
        )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                output = self._output()
                self.stop()
                raise RuntimeError(f"moto_server did not start on port {self.port}:\n{output}")
            time.sleep(0.05)
        return self

    def answers(self) -> bool:
        """True if an HTTP request gets any answer."""
        connection = (
            http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=1, context=ssl._create_unverified_context()
            )
            if self.tls
            else http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
        )
        try:
            connection.request("GET", "/moto-api/data.json")
            connection.getresponse().read()
            return True
        except OSError:
            return False
        finally:
            connection.close()

    def requests(self) -> list[tuple[str, str]]:
        """(method, path with its query) of every request the server has received, in
        order, from its own log (each request logged as it arrives, before its answer)."""
        if self._stderr is None:
            return []
        self._stderr.seek(0)
        return [
            (m.group(1), m.group(2)) for m in _REQUEST_LINE.finditer(self._stderr.read().decode())
        ]

    def _output(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode(errors="replace")

    def stop(self) -> None:
        """Terminate the server (kill it if it lingers); its state is lost."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def restart(self) -> None:
        """Stop, then start again on the same port (empty: buckets must be created again)."""
        self.stop()
        self.start()

    def client(self) -> Any:
        """A boto3 client of this server (synchronous: for fixtures and sync tests)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            verify=str(self.tls[0]) if self.tls else None,
            **CREDENTIALS,
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def rsm_overrides(self, bucket: str) -> dict[str, str]:
        """Broker properties that point the S3 plugin at this server."""
        return {
            "remote.log.storage.manager.class.name": "s3",
            **{f"rsm.config.{k}": v for k, v in rsm_configs(self.endpoint, bucket).items()},
        }


def rsm_configs(endpoint: str, bucket: str, **extra: str) -> dict[str, str]:
    """`S3RemoteStorageManager.configure()` settings for a moto server."""
    return {
        "storage.s3.bucket.name": bucket,
        "storage.s3.region": REGION,
        "storage.s3.endpoint.url": endpoint,
        "storage.s3.path.style.access.enabled": "true",
        "storage.aws.access.key.id": CREDENTIALS["aws_access_key_id"],
        "storage.aws.secret.access.key": CREDENTIALS["aws_secret_access_key"],
        **extra,
    }


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """The URL of a moto server shared by the tests of a module (use a bucket per test)."""
    server = MotoServer().start()
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    """A moto server of this test alone, free to be stopped and restarted."""
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


# Fault injection -------------------------------------------------------------------

Hook = Callable[[str, dict[str, Any]], Awaitable[None]]


def client_error(code: str, status: int, operation: str = "PutObject") -> ClientError:
    """The error botocore raises for an S3 error answer."""
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"injected {code}"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


class FaultyClient:
    """Wraps the plugin's S3 clients: records every call, and runs `hooks` before each.

    A hook gets the method name and arguments; it may raise (an injected failure),
    sleep (a slow call) or do anything else (stop the server) before the real call.
    `wrap` wraps the aiobotocore client; `wrap_reader` botocore's client of the
    reader threads, whose calls run the hooks on the event loop and wait for them.
    """

    def __init__(self) -> None:
        self.hooks: list[Hook] = []
        self.calls: list[tuple[str, str]] = []  # (method, key) of every call, in order
        self.completed: list[tuple[str, str]] = []  # (method, key) of the calls that succeeded

    def wrap(self, client: Any) -> Any:
        async def call(method: str, real: Any, **kwargs: Any) -> Any:
            key = self._called(method, kwargs)
            for hook in list(self.hooks):
                await hook(method, kwargs)
            result = await real(**kwargs)
            self.completed.append((method, key))
            return result

        return _Wrapped(client, call)

    def wrap_reader(self, client: Any, loop: asyncio.AbstractEventLoop) -> Any:
        def call(method: str, real: Any, **kwargs: Any) -> Any:
            key = self._called(method, kwargs)
            for hook in list(self.hooks):
                asyncio.run_coroutine_threadsafe(hook(method, kwargs), loop).result(30)
            result = real(**kwargs)
            self.completed.append((method, key))
            return result

        return _Wrapped(client, call)

    def _called(self, method: str, kwargs: dict[str, Any]) -> str:
        key = str(kwargs.get("Key", ""))
        self.calls.append((method, key))
        return key

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)

    def written(self) -> list[str]:
        """Keys whose upload completed (PutObject, CompleteMultipartUpload), in order."""
        return [
            key
            for method, key in self.completed
            if method in ("put_object", "complete_multipart_upload")
        ]


class _Wrapped:
    """A client whose S3 operations go through `call(method, real, **kwargs)`."""

    def __init__(self, client: Any, call: Callable[..., Any]) -> None:
        self._client = client
        self._call = call

    def __getattr__(self, method: str) -> Any:
        real = getattr(self._client, method)
        if method not in self._client.meta.method_to_api_mapping:  # not an S3 operation
            return real
        return functools.partial(self._call, method, real)


class InstrumentedS3(S3RemoteStorageManager):
    """The S3 plugin with its clients wrapped by one `FaultyClient` (`self.faulty`)."""

    def __init__(self) -> None:
        super().__init__()
        self.faulty = FaultyClient()

    async def client(self) -> Any:
        return self.faulty.wrap(await super().client())

    async def reader(self) -> Any:
        real = await super().reader()
        return self.faulty.wrap_reader(real, asyncio.get_running_loop())

    async def raw(self) -> Any:
        """The real aiobotocore client (for test set-up and inspection, not recorded)."""
        return await super().client()

    async def raw_reader(self) -> Any:
        """The real client of the reader threads (for inspection, not recorded)."""
        return await super().reader()


def serve(latency_ms: int, argv: list[str]) -> None:
    """moto_server (`argv` its arguments) that logs each request to stderr as it comes
    (werkzeug logs it only once answered) and answers it `latency_ms` later."""
    from moto import server

    dispatch = server.DomainDispatcherApplication.__call__

    def logged(self: Any, environ: Any, start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if not path.startswith("/moto-api"):
            query = environ.get("QUERY_STRING", "")
            target = f"{path}?{query}" if query else path
            sys.stderr.write(f"moto-request {environ['REQUEST_METHOD']} {target}\n")
            sys.stderr.flush()
            time.sleep(latency_ms / 1000)  # in the request's own thread
        return dispatch(self, environ, start_response)

    server.DomainDispatcherApplication.__call__ = logged  # type: ignore[method-assign]
    server.main(argv)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
