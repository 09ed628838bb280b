"""A small blocking Kafka wire client for tests: kio entities in, kio entities out.

`WireClient.request(entity)` frames a kio request payload with the request header
its class names (`__header_schema__`), sends it, and decodes the answer with the
matching kio response class and that class's response header. `send_raw` and
`send_frame` put arbitrary bytes on the wire, for tests of malformed input.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import socket
import struct
import time
import uuid
from collections.abc import Sequence
from functools import cache
from types import ModuleType
from typing import Any

from kio.index import load_payload_module, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from tierbroker.protocol.errors import ErrorCode

_SIZE = struct.Struct(">i")


def encode_request(entity: Any, correlation_id: int, client_id: str | None = "wire-test") -> bytes:
    """Header and body of a request entity, without the size prefix."""
    cls = type(entity)
    header_cls = cls.__header_schema__
    values = {
        "request_api_key": cls.__api_key__,
        "request_api_version": cls.__version__,
        "correlation_id": correlation_id,
    }
    if "client_id" in header_cls.__dataclass_fields__:
        values["client_id"] = client_id
    buffer = io.BytesIO()
    entity_writer(header_cls)(buffer, header_cls(**values))
    entity_writer(cls)(buffer, entity)
    return buffer.getvalue()


def decode_response(response_cls: Any, frame: bytes) -> tuple[int, Any]:
    """(correlation id, response entity) of a response frame without its size prefix."""
    header, header_size = entity_reader(response_cls.__header_schema__)(frame, 0)
    body, body_size = entity_reader(response_cls)(frame, header_size)
    if header_size + body_size != len(frame):
        raise ValueError(
            f"{len(frame) - header_size - body_size} trailing bytes after {response_cls.__name__}"
        )
    return header.correlation_id, body


class ConnectionClosed(Exception):
    """The broker closed the connection."""


class WireClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self._correlation_id = 0

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # Raw bytes ---------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, body: bytes) -> None:
        self.sock.sendall(_SIZE.pack(len(body)) + body)

    def _read_exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionClosed(f"connection closed with {left} of {n} bytes unread")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def read_frame(self) -> bytes:
        (size,) = _SIZE.unpack(self._read_exactly(4))
        return self._read_exactly(size)

    def is_closed(self, timeout_s: float = 5.0) -> bool:
        """True once the broker closes the connection (EOF or reset) within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        previous = self.sock.gettimeout()
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                try:
                    if not self.sock.recv(65536):
                        return True
                except (ConnectionResetError, BrokenPipeError):
                    return True
                except TimeoutError:
                    return False
            return False
        finally:
            self.sock.settimeout(previous)

    # Entities ----------------------------------------------------------------------

    def send(self, entity: Any, client_id: str | None = "wire-test") -> int:
        """Send a request entity; returns its correlation id."""
        self._correlation_id += 1
        self.send_frame(encode_request(entity, self._correlation_id, client_id))
        return self._correlation_id

    def receive(self, response_cls: Any, correlation_id: int) -> Any:
        got, body = decode_response(response_cls, self.read_frame())
        if got != correlation_id:
            raise AssertionError(f"correlation id {got}, expected {correlation_id}")
        return body

    def request(self, entity: Any, client_id: str | None = "wire-test") -> Any:
        """Send a request entity and return the decoded response entity of the same version."""
        cls = type(entity)
        correlation_id = self.send(entity, client_id)
        return self.receive(load_response_schema(cls.__api_key__, cls.__version__), correlation_id)


# Requests of any version ---------------------------------------------------------------


@cache
def request_module(api_key: int, version: int) -> ModuleType:
    return load_payload_module(api_key, version, EntityType.request)


def make(cls: type, **values: Any) -> Any:
    """An instance of the kio entity `cls` from those `values` its version has."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


FetchSpec = Sequence[tuple[str | uuid.UUID, Sequence[tuple[int, int]]]]
"""[(topic name, or id for v13+, [(partition, fetch offset), ...]), ...]"""


def create_topic(
    client: WireClient,
    name: str,
    partitions: int = 1,
    configs: dict[str, str] | None = None,
    replicas: list[int] | None = None,
) -> uuid.UUID:
    """CreateTopics v7 of `name` with replication factor 1, or of one partition on
    `replicas` (the first its preferred leader); its topic id."""
    m = request_module(19, 7)
    assignments = (
        ()
        if replicas is None
        else (m.CreatableReplicaAssignment(partition_index=0, broker_ids=tuple(replicas)),)
    )
    response = client.request(
        m.CreateTopicsRequest(
            topics=(
                m.CreatableTopic(
                    name=name,
                    num_partitions=partitions if replicas is None else -1,
                    replication_factor=1 if replicas is None else -1,
                    assignments=assignments,
                    configs=tuple(
                        m.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()
                    ),
                ),
            ),
            timeout=datetime.timedelta(seconds=10),
        )
    )
    (topic,) = response.topics
    assert topic.error_code == ErrorCode.none, topic
    return uuid.UUID(str(topic.topic_id))


def produce_batch(
    client: WireClient, topic: str, records: bytes, partition: int = 0, version: int = 9
) -> Any:
    """Produce `records` to one partition with acks=all; that partition's response."""
    m = request_module(0, version)
    response = client.request(
        m.ProduceRequest(
            acks=-1,
            timeout=datetime.timedelta(seconds=10),
            topic_data=(
                m.TopicProduceData(
                    name=topic,
                    partition_data=(m.PartitionProduceData(index=partition, records=records),),
                ),
            ),
        )
    )
    ((answer,),) = (t.partition_responses for t in response.responses)
    return answer


def fetch_request(
    version: int,
    topics: FetchSpec,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 50 * 1024 * 1024,
    partition_max_bytes: int = 1024 * 1024,
    rack_id: str = "",
) -> Any:
    m = request_module(1, version)
    return make(
        m.FetchRequest,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        forgotten_topics_data=(),
        rack_id=rack_id,
        topics=tuple(
            make(
                m.FetchTopic,
                topic=key,
                topic_id=key,
                partitions=tuple(
                    make(
                        m.FetchPartition,
                        partition=p,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=partition_max_bytes,
                    )
                    for p, offset in partitions
                ),
            )
            for key, partitions in topics
        ),
    )


def split_batches(records: bytes | None) -> tuple[list[bytes], int]:
    """(whole batches, bytes of a trailing partial batch) of a fetched records field."""
    data = records or b""
    batches, position = [], 0
    while position + 12 <= len(data):
        (length,) = struct.unpack_from(">i", data, position + 8)
        if position + 12 + length > len(data):
            break
        batches.append(data[position : position + 12 + length])
        position += 12 + length
    return batches, len(data) - position


def list_offsets(
    client: WireClient, topic: str, timestamp: int, version: int = 8, replica_id: int = -1
) -> tuple[int, int, int, int]:
    """(error, offset, timestamp, leader epoch) of partition 0 for `timestamp`, asked as a
    consumer (replica id -1) or as `replica_id` (-2: the debugging consumer)."""
    m = request_module(2, version)
    response = client.request(
        make(
            m.ListOffsetsRequest,
            replica_id=replica_id,
            isolation_level=0,
            timeout=datetime.timedelta(seconds=5),
            topics=(
                m.ListOffsetsTopic(
                    name=topic,
                    partitions=(
                        make(
                            m.ListOffsetsPartition,
                            partition_index=0,
                            current_leader_epoch=-1,
                            timestamp=timestamp,
                        ),
                    ),
                ),
            ),
        )
    )
    (p,) = response.topics[0].partitions
    return p.error_code, p.offset, p.timestamp, p.leader_epoch
