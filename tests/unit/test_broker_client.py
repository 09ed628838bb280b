"""`BrokerClient`: responses received into their frame buffers, matched to their requests."""

from __future__ import annotations

import asyncio
import datetime
import os
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from kio.schema.api_versions.v0 import response as versions
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v17 import request as fetch_request
from kio.schema.fetch.v17 import response as fetch_response
from kio.schema.types import BrokerId
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from tierbroker.broker.network.broker_client import (
    BrokerClient,
    BrokerUnavailable,
    MalformedResponse,
)
from tierbroker.protocol.codec import encode_response, parse_request, peek_header

TOPIC_ID = uuid.uuid4()
MIB = 1 << 20

# What the fake peer does with a Fetch: (correlation id, fetch offset, the connection).
Answer = Callable[[int, int, asyncio.StreamWriter], Awaitable[None]]


def frame_of(correlation_id: int, body: object) -> bytes:
    return b"".join(bytes(p) for p in encode_response(correlation_id, body))  # type: ignore[arg-type]


def fetch_answer(records: bytes, offset: int) -> fetch_response.FetchResponse:
    partition = fetch_response.PartitionData(
        partition_index=i32(0),
        error_code=ErrorCode.none,
        high_watermark=i64(offset),
        last_stable_offset=i64(offset),
        log_start_offset=i64(0),
        aborted_transactions=None,
        preferred_read_replica=BrokerId(-1),
        records=records,  # type: ignore[arg-type]
    )
    return fetch_response.FetchResponse(
        throttle_time=datetime.timedelta(0),  # type: ignore[arg-type]
        error_code=ErrorCode.none,
        session_id=i32(0),
        responses=(
            fetch_response.FetchableTopicResponse(topic_id=TOPIC_ID, partitions=(partition,)),
        ),
    )


def fetch_at(offset: int) -> fetch_request.FetchRequest:
    return fetch_request.FetchRequest(
        replica_state=fetch_request.ReplicaState(replica_id=BrokerId(1), replica_epoch=i64(0)),
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=0)),
        min_bytes=i32(1),
        max_bytes=i32(64 * MIB),
        isolation_level=i8(0),
        topics=(
            fetch_request.FetchTopic(
                topic_id=TOPIC_ID,
                partitions=(
                    fetch_request.FetchPartition(
                        partition=i32(0),
                        current_leader_epoch=i32(0),
                        fetch_offset=i64(offset),
                        last_fetched_epoch=i32(-1),
                        log_start_offset=i64(0),
                        partition_max_bytes=i32(64 * MIB),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


@asynccontextmanager
async def peer(answer: Answer) -> AsyncIterator[tuple[int, list[int]]]:
    """A broker that answers ApiVersions itself and Fetch with `answer`; its port, and how
    many connections it accepted (one entry per connection)."""
    accepted: list[int] = []
    answering: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writers.append(writer)
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                api_key, _, correlation_id = peek_header(frame)
                if api_key == 18:
                    keys = (
                        versions.ApiVersion(
                            api_key=i16(1), min_version=i16(4), max_version=i16(17)
                        ),
                        versions.ApiVersion(
                            api_key=i16(18), min_version=i16(0), max_version=i16(3)
                        ),
                    )
                    body = versions.ApiVersionsResponse(error_code=ErrorCode.none, api_keys=keys)
                    writer.write(frame_of(correlation_id, body))
                    continue
                offset = int(parse_request(frame).body.topics[0].partitions[0].fetch_offset)
                task = asyncio.get_running_loop().create_task(
                    answer(correlation_id, offset, writer)
                )
                answering.add(task)
                task.add_done_callback(answering.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        for task in answering:
            task.cancel()
        await asyncio.gather(*answering, return_exceptions=True)
        server.close()
        for writer in writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        await server.wait_closed()


def records_of(response: fetch_response.FetchResponse) -> bytes:
    return bytes(response.responses[0].partitions[0].records or b"")


async def test_a_large_response_sent_a_few_bytes_at_a_time_arrives_whole() -> None:
    payload = os.urandom(3 * MIB + 17)

    async def answer(correlation_id: int, offset: int, writer: asyncio.StreamWriter) -> None:
        frame = frame_of(correlation_id, fetch_answer(payload, offset))
        for start in range(0, len(frame), 100_003):
            writer.write(frame[start : start + 100_003])
            await writer.drain()
            await asyncio.sleep(0)

    async with peer(answer) as (port, _):
        client = BrokerClient("127.0.0.1", port, "test")
        try:
            response = await client.send(fetch_at(5))
            assert records_of(response) == payload
            assert response.responses[0].partitions[0].high_watermark == 5
        finally:
            await client.close()


async def test_pipelined_requests_get_their_own_answers_whatever_the_order() -> None:
    async def answer(correlation_id: int, offset: int, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.01 * (10 - offset))  # the last asked is answered first
        writer.write(frame_of(correlation_id, fetch_answer(b"%d" % offset * 70_000, offset)))

    async with peer(answer) as (port, _):
        client = BrokerClient("127.0.0.1", port, "test")
        try:
            responses = await asyncio.gather(*(client.send(fetch_at(i)) for i in range(10)))
            for i, response in enumerate(responses):
                assert records_of(response) == b"%d" % i * 70_000
        finally:
            await client.close()


async def test_a_connection_lost_mid_response_fails_waiters_and_the_next_one_reconnects() -> None:
    async def answer(correlation_id: int, offset: int, writer: asyncio.StreamWriter) -> None:
        frame = frame_of(correlation_id, fetch_answer(b"x" * MIB, offset))
        if offset == 0:
            writer.write(frame[: len(frame) // 2])
            await writer.drain()
            writer.transport.abort()
            return
        writer.write(frame)

    async with peer(answer) as (port, accepted):
        client = BrokerClient("127.0.0.1", port, "test")
        try:
            lost = await asyncio.gather(
                client.send(fetch_at(0)), client.send(fetch_at(0)), return_exceptions=True
            )
            assert all(isinstance(e, BrokerUnavailable) for e in lost)
            response = await client.send(fetch_at(1))
            assert records_of(response) == b"x" * MIB
            assert len(accepted) == 2
        finally:
            await client.close()


async def test_a_peer_that_does_not_answer_times_out_and_a_closed_client_refuses() -> None:
    async def answer(correlation_id: int, offset: int, writer: asyncio.StreamWriter) -> None:
        return  # never answers

    async with peer(answer) as (port, _):
        client = BrokerClient("127.0.0.1", port, "test", request_timeout_ms=200)
        with pytest.raises(BrokerUnavailable, match="no answer within 200 ms"):
            await client.send(fetch_at(0))
        await client.close()
        with pytest.raises(BrokerUnavailable, match="closed"):
            await client.send(fetch_at(0))


async def test_an_undecodable_response_fails_its_request_and_the_connection_goes_on() -> None:
    async def answer(correlation_id: int, offset: int, writer: asyncio.StreamWriter) -> None:
        if offset == 0:
            body = struct.pack(">i", correlation_id) + b"\xff" * 7  # a frame, not a response
            writer.write(struct.pack(">i", len(body)) + body)
            return
        writer.write(frame_of(correlation_id, fetch_answer(b"r", offset)))

    async with peer(answer) as (port, accepted):
        client = BrokerClient("127.0.0.1", port, "test")
        try:
            with pytest.raises(MalformedResponse):
                await client.send(fetch_at(0))
            assert records_of(await client.send(fetch_at(1))) == b"r"
            assert len(accepted) == 1
        finally:
            await client.close()
