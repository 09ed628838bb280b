"""`tierbroker produce TOPIC` and `tierbroker consume TOPIC`: lines on stdin become
records, records become lines on stdout, as kcat's -P and -C do.

A produced line is `[key DELIM] value`; a consumed record is printed through a kcat-style
format (`%k %s %h %t %p %o %T`), or as one JSON object per line for scripts.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from tierbroker.broker.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    Output,
    Timeout,
    client_config,
    describe_error,
    fail,
    failing,
    key_values,
    records,
    show_progress,
)

if TYPE_CHECKING:
    from confluent_kafka import Message, Producer

KeyDelimiter = Annotated[
    str | None, typer.Option("--key-delimiter", "-K", help="split key and value at this string")
]
FORMAT_FIELDS = "ktpoTsh"


class IsolationLevel(StrEnum):
    read_uncommitted = "read_uncommitted"  # kafka-console-consumer's default too
    read_committed = "read_committed"


TAIL_BASE = -2000  # librdkafka's RD_KAFKA_OFFSET_TAIL_BASE: -2000 - N is "N before the end"


def produce(
    topic: str,
    key_delimiter: KeyDelimiter = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="k=v on every record, repeatable")
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", "-p", help="default: by key, or sticky")
    ] = None,
    acks: Annotated[str, typer.Option(help="all, 1 or 0")] = "all",
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
) -> None:
    """Produce each line of stdin as one record."""
    from confluent_kafka import Producer

    headers: list[tuple[str, str | bytes | None]] = list(key_values(header, "--header").items())
    delimiter = key_delimiter.encode() if key_delimiter else None
    failed: list[str] = []

    def on_error(error: Any, _message: Any) -> None:  # only failures are reported
        failed.append(describe_error(error))

    config = client_config(bootstrap, timeout) | {
        "acks": acks,
        "enable.idempotence": acks == "all",  # retries keep the lines' order
        "linger.ms": 5,
        "message.timeout.ms": max(int(timeout * 1000), 1),
        "delivery.report.only.error": True,
        "on_delivery": on_error,
    }
    options: dict[str, Any] = {}
    if headers:
        options["headers"] = headers
    if partition is not None:
        options["partition"] = partition
    what = f"produce to {topic}"
    with failing(what, bootstrap):
        producer = Producer(config)
        _check_topic(producer.list_topics(topic, timeout=timeout), topic)
        sent = 0
        # not while a person types the records
        with _progress("produced", show_progress() and not sys.stdin.isatty()) as advance:
            try:
                # stdin's buffer is a BufferedReader (typed as a plain BinaryIO)
                for lines in _lines(cast(io.BufferedIOBase, sys.stdin.buffer)):
                    for line in lines:
                        key = None
                        if delimiter is not None and delimiter in line:
                            key, line = line.split(delimiter, 1)
                        try:
                            producer.produce(topic, line, key, **options)
                        except BufferError:  # the local queue is full: wait for deliveries
                            _send_when_queued(producer, topic, line, key, options)
                        sent += 1
                    producer.poll(0)  # serve callbacks
                    advance(sent)
                    if failed:
                        break
            except KeyboardInterrupt:  # deliver what was read, then stop
                pass
            left = producer.flush(timeout)
            advance(sent)
    if failed or left:
        fail(
            f"{what}: {len(failed) + left} of {records(sent)} not delivered: "
            f"{failed[0] if failed else 'timed out'}"
        )
    typer.echo(f"produced {records(sent)} to {topic}", err=True)


def _lines(stream: io.BufferedIOBase) -> Iterator[list[bytes]]:
    """The lines of `stream` without their newlines, a list per read: a file's or a pipe's
    in reads of up to 1 MiB (a Python call per line is the cost to keep low), a
    terminal's as each line is typed. The last line needs no newline."""
    tail = b""
    while chunk := stream.read1(1 << 20):
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        yield lines
    if tail:
        yield [tail]


def _send_when_queued(
    producer: Producer, topic: str, value: bytes, key: bytes | None, options: dict[str, Any]
) -> None:
    """Queue one record the full local queue refused, serving deliveries meanwhile."""
    while True:
        producer.poll(0.005)
        try:
            producer.produce(topic, value, key, **options)
            return
        except BufferError:
            continue


def consume(
    topic: str,
    partition: Annotated[
        list[int] | None, typer.Option("--partition", "-p", help="repeatable; default: all")
    ] = None,
    offset: Annotated[
        str | None,
        typer.Option(
            "--offset",
            "-o",
            help="beginning, end, N, or -N (N before the end); default: the group's "
            "committed offsets with -G, else beginning",
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group", "-G", help="start from this group's committed offsets; commit what is read"
        ),
    ] = None,
    count: Annotated[int | None, typer.Option("--count", "-c", help="stop after N records")] = None,
    exit_at_end: Annotated[
        bool, typer.Option("--exit", "-e", help="stop at the end of every partition")
    ] = False,
    key_delimiter: KeyDelimiter = None,
    print_headers: Annotated[
        bool, typer.Option("--print-headers", help="append TAB and k=v,k2=v2 to each line")
    ] = False,
    isolation_level: Annotated[
        IsolationLevel,
        typer.Option(
            "--isolation-level",
            help="read_committed: only committed transactions, up to the last stable offset",
        ),
    ] = IsolationLevel.read_uncommitted,
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            help="kcat-style: %k key, %s value, %h headers, %t topic, %p partition, "
            "%o offset, %T timestamp (ms), \\n, \\t",
        ),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    timeout: Timeout = 10.0,
    output: Annotated[
        Output, typer.Option("--output", help="json: one object per record and line")
    ] = Output.table,
) -> None:
    """Print records as lines, from --offset on, until interrupted, --count or --exit.

    With --group the partitions are still assigned, not subscribed: the group's committed
    offsets are read and written as a simple consumer does, so no rebalance happens.
    """
    from confluent_kafka import (
        OFFSET_BEGINNING,
        OFFSET_END,
        OFFSET_STORED,
        Consumer,
        KafkaError,
        TopicPartition,
    )

    if fmt is None:
        fmt = (
            (f"%k{key_delimiter}%s" if key_delimiter else "%s")
            + ("\t%h" if print_headers else "")
            + "\\n"
        )
    if offset is None:
        offset = "stored" if group else "beginning"
    start = {"beginning": OFFSET_BEGINNING, "end": OFFSET_END, "stored": OFFSET_STORED}.get(offset)
    if start is None:
        try:
            n = int(offset)
        except ValueError:
            raise typer.BadParameter(f"--offset {offset!r}: beginning, end, N or -N") from None
        start = n if n >= 0 else TAIL_BASE + n
    config = client_config(bootstrap, timeout) | {
        "group.id": group or "tierbroker-cli",  # never joined: partitions are assigned
        "auto.offset.reset": "earliest",  # for a partition the group has no offset for
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": exit_at_end,
        "isolation.level": isolation_level.value,
        # librdkafka stops fetching for this long once its prefetch queue is full (default
        # 1000 ms): a Python reader slower than the broker would wait whole seconds.
        "fetch.queue.backoff.ms": 10,
    }
    what = f"consume from {topic}"
    out = sys.stdout.buffer
    seen = 0
    printed: dict[int, int] = {}  # partition: the offset after the last record printed
    with failing(what, bootstrap):
        consumer = Consumer(config)
        try:
            metadata = _check_topic(consumer.list_topics(topic, timeout=timeout), topic)
            partitions = sorted(partition) if partition else sorted(metadata.partitions)
            unknown = set(partitions) - set(metadata.partitions)
            if unknown:
                fail(f"{what}: no partition {min(unknown)}")
            consumer.assign([TopicPartition(topic, p, start) for p in partitions])
            at_end: set[int] = set()
            render = _json_line if output is Output.json else _formatter(fmt)
            lines: list[bytes] = []
            ends: dict[int, int] = {}  # of `lines`, by partition

            def emit() -> None:
                """Write a batch's lines in one call; only then do they count as printed
                (and get committed)."""
                out.write(b"".join(lines))
                out.flush()
                printed.update(ends)
                lines.clear()
                ends.clear()

            # not while records go to the same terminal
            with _progress("consumed", show_progress() and not sys.stdout.isatty()) as advance:
                while count is None or seen < count:
                    for message in consumer.consume(500, 0.5):
                        error = message.error()
                        if error is not None:
                            if error.code() == KafkaError._PARTITION_EOF:
                                at_end.add(message.partition() or 0)
                            elif not error.retriable():
                                emit()
                                fail(f"{what}: {describe_error(error)}")
                            continue
                        at_end.discard(message.partition() or 0)
                        lines.append(render(message))
                        seen += 1
                        ends[message.partition() or 0] = (message.offset() or 0) + 1
                        if count is not None and seen >= count:
                            break
                    emit()
                    advance(seen)
                    if exit_at_end and at_end >= set(partitions):
                        break
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:  # the reader went away (`| head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        finally:
            try:
                if group and printed:
                    commits = [TopicPartition(topic, p, o) for p, o in sorted(printed.items())]
                    consumer.commit(offsets=commits, asynchronous=False)
            finally:
                consumer.close()


def _check_topic(metadata: Any, topic: str) -> Any:
    """The topic's metadata; an unknown topic is a one-line error."""
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        reason = describe_error(found.error) if found is not None else "not in metadata"
        fail(f"unknown topic {topic} ({reason})")
    return found


@contextmanager
def _progress(verb: str, enabled: bool) -> Iterator[Any]:
    """A spinner with a record count on stderr if `enabled`; a no-op otherwise."""
    if not enabled:
        yield lambda _n: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (
        SpinnerColumn(),
        TextColumn(f"{verb} {{task.completed}} records"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(verb, total=None)
        yield lambda n: progress.update(task, completed=n)


def _formatter(fmt: str) -> Callable[[Message], bytes]:
    """A kcat-style format string, parsed once: what turns a message into its bytes."""
    parts: list[bytes | str] = []  # bytes: as they are; str: a field of the message
    literal = bytearray()
    i = 0
    while i < len(fmt):
        c = fmt[i]
        if c in "%\\" and i + 1 < len(fmt):
            token = fmt[i + 1]
            i += 2
            if c == "\\":
                literal += {"n": b"\n", "t": b"\t", "\\": b"\\"}.get(token, b"\\" + token.encode())
            elif token in FORMAT_FIELDS:
                parts += [bytes(literal), token] if literal else [token]
                literal.clear()
            else:
                literal += b"%" + token.encode()
            continue
        literal += c.encode()
        i += 1
    if literal:
        parts.append(bytes(literal))
    if parts == ["s", b"\n"]:  # the default: each value on a line of its own
        return lambda message: (message.value() or b"") + b"\n"
    return lambda message: b"".join(
        p if isinstance(p, bytes) else _field(message, p) for p in parts
    )


def _field(message: Message, token: str) -> bytes:
    if token == "k":
        return message.key() or b""
    if token == "s":
        return message.value() or b""
    if token == "h":
        return b",".join(k.encode() + b"=" + _bytes(v) for k, v in _headers(message))
    if token == "t":
        return (message.topic() or "").encode()
    if token == "p":
        return str(message.partition()).encode()
    if token == "o":
        return str(message.offset()).encode()
    return str(message.timestamp()[1]).encode()


def _json_line(message: Message) -> bytes:
    """One record as a JSON object on one line; bytes decoded as UTF-8 (invalid bytes
    replaced)."""

    def text(value: bytes | str | None) -> str | None:
        return value.decode(errors="replace") if isinstance(value, bytes) else value

    record = {
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp": message.timestamp()[1],
        "key": text(message.key()),
        "value": text(message.value()),
        "headers": [[k, text(v)] for k, v in _headers(message)],
    }
    return json.dumps(record).encode() + b"\n"


def _headers(message: Message) -> list[tuple[str, str | bytes | None]]:
    headers = message.headers()
    return list(headers.items()) if isinstance(headers, dict) else list(headers or ())


def _bytes(value: str | bytes | None) -> bytes:
    return value.encode() if isinstance(value, str) else value or b""
