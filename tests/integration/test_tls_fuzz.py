"""Fuzzed TLS handshakes against a broker process's SSL listener: random bytes, a real
ClientHello with bytes flipped, cut short or a length inflated, good handshakes whose
records are cut at random points, clients that stop mid-handshake, and a slowloris of
connections that each send one TLS byte. Every bad connection is closed (a TLS alert at
most is sent) within the handshake bound, `connections.max.idle.ms`, small here; a good
client is served after each, and while the slowloris holds its connections; after
hundreds of bad handshakes the broker holds no more sockets than before and its resident
memory has grown by little.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import struct
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.certs import STORE_PASSWORD, Certificates, session_certs
from tests.integration.broker_process import BrokerProcess
from tests.integration.waiting import wait_for

HANDSHAKE_BOUND_MS = 1000  # connections.max.idle.ms, which bounds a TLS handshake
# A bad connection is closed within the bound; the rest is room for a loaded machine.
CLOSED_WITHIN_S = HANDSHAKE_BOUND_MS / 1000 + 8.0
FUZZ = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 7, 4) + b"test"


@dataclass(frozen=True, slots=True)
class TlsBroker:
    """A broker process, its SSL listener's port, and the CA that signed its certificate."""

    process: BrokerProcess
    port: int  # its SSL listener's
    ca: Path

    @property
    def pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    certs: Certificates = session_certs()
    process = BrokerProcess(
        tmp_path_factory.mktemp("tls-fuzz"),
        {
            "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL",
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(certs.broker.p12),
            "ssl.keystore.password": STORE_PASSWORD,
            "connections.max.idle.ms": str(HANDSHAKE_BOUND_MS),
        },
    ).start()
    try:
        (ports,) = json.loads(process.ports_file.read_text())
        port = next(x["port"] for x in ports["listeners"] if x["name"] == "SSL")
        yield TlsBroker(process, port, certs.ca.cert)
    finally:
        process.stop()


def client_context(ca: Path | None = None) -> ssl.SSLContext:
    """A client's TLS: trusting `ca`, or (for a ClientHello alone) nothing checked."""
    if ca is not None:
        return ssl.create_default_context(cafile=str(ca))
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def make_client_hello() -> bytes:
    """The first flight of a real TLS client: one record holding its ClientHello."""
    outgoing = ssl.MemoryBIO()
    client = client_context().wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="localhost")
    try:
        client.do_handshake()
    except ssl.SSLWantReadError:  # it waits for the server's answer
        return outgoing.read()
    raise AssertionError("a handshake completed without a server")


CLIENT_HELLO = make_client_hello()


def length_fields(hello: bytes) -> list[tuple[int, int]]:
    """(offset, size) of the ClientHello's length fields: the record's, the handshake
    message's, the session id's, the cipher suites', the compression methods' and the
    extensions'."""
    session = 43  # record header 5, handshake header 4, version 2, random 32
    suites = session + 1 + hello[session]
    compression = suites + 2 + int.from_bytes(hello[suites : suites + 2], "big")
    extensions = compression + 1 + hello[compression]
    return [(3, 2), (6, 3), (session, 1), (suites, 2), (compression, 1), (extensions, 2)]


@st.composite
def mutated_client_hellos(draw: st.DrawFn) -> bytes:
    hello = bytearray(CLIENT_HELLO)
    kind = draw(st.sampled_from(["flip", "truncate", "inflate"]))
    if kind == "flip":
        for position in draw(st.lists(st.integers(0, len(hello) - 1), min_size=1, max_size=8)):
            hello[position] ^= draw(st.integers(1, 255))
    elif kind == "truncate":
        del hello[draw(st.integers(1, len(hello) - 1)) :]
    else:
        offset, size = draw(st.sampled_from(length_fields(CLIENT_HELLO)))
        current = int.from_bytes(hello[offset : offset + size], "big")
        inflated = draw(st.integers(current + 1, 256**size - 1))
        hello[offset : offset + size] = inflated.to_bytes(size, "big")
    return bytes(hello)


def connect(broker: TlsBroker) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=CLOSED_WITHIN_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def closed_by_broker(sock: socket.socket, deadline: float) -> bool:
    """Whether the broker closes `sock` before `deadline` (monotonic), whatever it sends
    first (a TLS alert, or its part of a handshake)."""
    while (left_s := deadline - time.monotonic()) > 0:
        sock.settimeout(left_s)
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
    return False


def send_and_expect_close(broker: TlsBroker, data: bytes, end_input: bool) -> None:
    """Send `data` (then end the input, if `end_input`): the broker must close the
    connection within the bound."""
    with connect(broker) as sock:
        try:
            sock.sendall(data)
            if end_input:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return  # closed already
        assert closed_by_broker(sock, time.monotonic() + CLOSED_WITHIN_S), (
            f"open {CLOSED_WITHIN_S} s after {data[:16].hex()}... ({len(data)} bytes)"
        )


def served(broker: TlsBroker) -> bool:
    """A good TLS client's ApiVersions request answered."""
    with connect(broker) as raw:
        with client_context(broker.ca).wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0)
            return read_frame(tls) is not None


def read_frame(sock: socket.socket | ssl.SSLSocket) -> bytes | None:
    size = read_exactly(sock, 4)
    return None if size is None else read_exactly(sock, struct.unpack(">i", size)[0])


def read_exactly(sock: socket.socket | ssl.SSLSocket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


@FUZZ
@given(data=st.binary(min_size=1, max_size=4096), end_input=st.booleans())
def test_random_bytes(broker: TlsBroker, data: bytes, end_input: bool) -> None:
    send_and_expect_close(broker, data, end_input)
    assert served(broker)


@FUZZ
@given(hello=mutated_client_hellos(), end_input=st.booleans())
def test_mutated_client_hello(broker: TlsBroker, hello: bytes, end_input: bool) -> None:
    send_and_expect_close(broker, hello, end_input)
    assert served(broker)


@settings(FUZZ, max_examples=25)
@given(cuts=st.lists(st.integers(1, 300), min_size=1, max_size=12))
def test_records_cut_at_random_points(broker: TlsBroker, cuts: list[int]) -> None:
    """A good client whose every flight, and then its request, is sent in pieces of the
    drawn sizes, in turn (each its own TCP segment, TCP_NODELAY): the handshake completes
    and the request is answered."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context(broker.ca).wrap_bio(incoming, outgoing, server_hostname="localhost")
    pieces = iter(cuts * 1000)

    def flush(sock: socket.socket) -> None:
        data = outgoing.read()
        while data:
            size = next(pieces)
            sock.sendall(data[:size])
            data = data[size:]

    with connect(broker) as sock:
        while True:
            try:
                client.do_handshake()
                break
            except ssl.SSLWantReadError:
                flush(sock)
                received = sock.recv(65536)
                assert received, "closed during a good handshake"
                incoming.write(received)
        client.write(struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0)
        flush(sock)
        answer = b""
        while len(answer) < 4:
            try:
                answer += client.read(65536)
            except ssl.SSLWantReadError:
                received = sock.recv(65536)
                assert received, "closed before answering"
                incoming.write(received)
    assert struct.unpack(">i", answer[:4])[0] > 0


def hold(broker: TlsBroker, first_bytes: list[bytes]) -> list[socket.socket]:
    """Connections that each send their bytes and then nothing more."""
    held = []
    for data in first_bytes:
        sock = connect(broker)
        sock.sendall(data)
        held.append(sock)
    return held


def assert_all_closed(held: list[socket.socket]) -> None:
    deadline = time.monotonic() + CLOSED_WITHIN_S
    try:
        still_open = sum(not closed_by_broker(sock, deadline) for sock in held)
        assert still_open == 0, f"{still_open} of {len(held)} connections left open"
    finally:
        for sock in held:
            sock.close()


def test_clients_that_stop_mid_handshake_are_closed(broker: TlsBroker) -> None:
    """Cut anywhere in the ClientHello, or after all of it (the broker has answered and
    waits for the client's next flight)."""
    cuts = [*range(1, len(CLIENT_HELLO), 7), len(CLIENT_HELLO)]
    held = hold(broker, [CLIENT_HELLO[:cut] for cut in cuts])
    assert served(broker)
    assert_all_closed(held)


def test_slowloris_of_one_tls_byte(broker: TlsBroker) -> None:
    """Many connections that send the first byte of a TLS record and stop: the others are
    still served, and all of them are closed by the handshake bound."""
    held = hold(broker, [b"\x16"] * 200)
    assert served(broker)
    assert_all_closed(held)
    assert served(broker)


def resident_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    (line,) = [x for x in status.splitlines() if x.startswith("VmRSS:")]
    return int(line.split()[1]) * 1024


def open_sockets(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    return sum(os.readlink(fd).startswith("socket:") for fd in fds.iterdir())


def failed_authentications(broker: TlsBroker) -> float:
    """Kafka's failed-authentication-total of the SSL listener, from the broker's metrics."""
    url = f"http://127.0.0.1:{broker.process.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=CLOSED_WITHIN_S) as response:
        text = response.read().decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    wanted = ("failed_authentication_total", {"listener": "SSL"})
    return next((s.value for s in samples if (s.name, s.labels) == wanted), 0.0)


def test_memory_and_sockets_stay_bounded(broker: TlsBroker) -> None:
    """400 bad handshakes after a warm-up of 50, each a failed authentication: the
    broker's resident memory grows by less than 32 MiB, and it holds no more sockets than
    before once they are closed."""
    bad = [
        os.urandom(512),
        CLIENT_HELLO[:100],
        CLIENT_HELLO[:5] + bytes(len(CLIENT_HELLO) - 5),
        CLIENT_HELLO[:3] + b"\xff\xff" + CLIENT_HELLO[5:],
        CLIENT_HELLO,  # answered with the broker's flight, then the client's end of input
    ]

    def bad_handshakes(count: int) -> None:
        for i in range(count):
            send_and_expect_close(broker, bad[i % len(bad)], end_input=True)

    bad_handshakes(50)
    assert served(broker)
    sockets, resident = open_sockets(broker.pid), resident_bytes(broker.pid)
    failed = failed_authentications(broker)
    bad_handshakes(400)
    assert served(broker)
    wait_for(lambda: failed_authentications(broker) >= failed + 400, "400 failures counted")
    wait_for(lambda: open_sockets(broker.pid) <= sockets, f"at most {sockets} sockets held")
    grown = resident_bytes(broker.pid) - resident
    assert grown < 32 * 1024 * 1024, f"resident memory grew by {grown} bytes"
