"""The options of the `tierbroker` Spark source, checked as Spark's Kafka source checks them.

Option names are case-insensitive. Spark's Kafka source options keep their names and
meanings; a few of tierbroker's own say where the remote tier is and how to cut it:

- `storage` (required): `file:///dir` or `s3://bucket/prefix?endpoint=...` (see
  `pipeline.storage`); RSM-named settings (`storage.aws.access.key.id`, ...,
  `key.prefix`) pass through to the store.
- Exactly one of `subscribe` (topics, comma-separated; `topic` is a synonym),
  `subscribePattern` (a regular expression a whole topic name must match) and
  `assign` (JSON, `{"events":[0,1]}`). `partitions` (comma-separated numbers)
  narrows `subscribe` and `subscribePattern` to those partitions.
- `cluster`, `key.prefix.entropy.bits` (synonym `entropyBits`): where the broker's
  `ObjectKeyLayout` put the objects (see `pipeline.discovery`).
- `startingOffsets` / `endingOffsets`: `earliest`, `latest`, or JSON per partition,
  `{"events":{"0":23,"1":-2}}` (-2 earliest, -1 latest); ending offsets are
  exclusive; partitions left out of the JSON read from earliest / to latest. A
  batch read cannot start at `latest` or end at `earliest`, as in Spark.
- `startingTimestamp` / `endingTimestamp` (ms, every partition), or
  `startingOffsetsByTimestamp` / `endingOffsetsByTimestamp` (JSON per partition):
  the first offset whose timestamp is >= the given one, as ListOffsets answers.
  Timestamps win over offsets. When no record qualifies, an ending bound is the
  latest offset; a starting bound fails the read, or is the latest offset with
  `startingOffsetsByTimestampStrategy=latest`.
- `kafka.bootstrap.servers`: read the whole topic. Offsets the remote tier does
  not hold (the untiered tail) are read through the brokers, and `latest` is the
  log end offset. Without it, only the remote tier is read and `latest` is its end.
  Other `kafka.*` options configure that Kafka client (librdkafka, so its property
  names: `kafka.client.rack` fetches from the closest replica); `kafka.group.id`
  or `groupIdPrefix` name its group (it never joins one); `kafkaConsumer.pollTimeoutMs`
  (default 120 s) bounds a wait for records.
- `maxBytesPerPartition` (default 128 MiB): consecutive segments of a partition
  are packed into input partitions of about this many bytes; larger segments are
  cut at offset index entries. `maxRecordsPerPartition` caps the offsets of an
  input partition, and `minPartitions` splits the largest until there are that
  many, with Spark's arithmetic.
- `includeHeaders` (default false): the `headers` column, as in Spark.
- `failOnDataLoss` (default true): data gone between planning and reading (a
  segment deleted by retention, an offset the broker no longer has) fails the
  query; false skips it with a warning.
- `maxOffsetsPerTrigger` (streaming): at most this many offsets per micro-batch,
  shared among partitions in proportion to what each has to read.
- `segments`: comma-separated remote segment ids to read (the export job's resume).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from tierbroker.pipeline.storage import ObjectStore, open_store

DEFAULT_MAX_BYTES_PER_PARTITION = 128 * 1024 * 1024
DEFAULT_POLL_TIMEOUT_MS = 120_000
EARLIEST, LATEST = -2, -1

Offsets = dict[str, dict[str, int]]
"""Per topic, per partition (as a string): an offset or a timestamp, as in Spark's JSON."""

STRATEGIES = ("subscribe", "subscribepattern", "assign")
KNOWN = (
    "storage",
    "storage.*",
    "encryption.*",
    "key.prefix",
    "cluster",
    "key.prefix.entropy.bits",
    "entropyBits",
    "subscribe",
    "topic",
    "subscribePattern",
    "assign",
    "partitions",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "failOnDataLoss",
    "includeHeaders",
    "minPartitions",
    "maxRecordsPerPartition",
    "maxBytesPerPartition",
    "maxOffsetsPerTrigger",
    "kafka.bootstrap.servers",
    "kafka.*",
    "groupIdPrefix",
    "kafkaConsumer.pollTimeoutMs",
    "segments",
)
_KNOWN_LOWER = {k.lower() for k in KNOWN if not k.endswith("*")}
_PREFIXES = ("storage.", "encryption.", "kafka.")

# Kafka consumer settings the source decides itself (Spark refuses the same ones).
_REFUSED_KAFKA = {
    "auto.offset.reset": "set startingOffsets to earliest or latest instead",
    "key.deserializer": "keys are bytes; deserialize them with DataFrame operations",
    "value.deserializer": "values are bytes; deserialize them with DataFrame operations",
    "enable.auto.commit": "the source commits nothing to the group",
    "interceptor.classes": "interceptors could change records",
}


def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name}={text!r} must be true or false")
    return value == "true"


def include_headers(raw: dict[str, str]) -> bool:
    """The `includeHeaders` option (false unless given), which decides the schema."""
    return _flag({k.lower(): v for k, v in raw.items()}, "includeHeaders", False)


def _number(options: dict[str, str], name: str, positive: bool = False) -> int | None:
    text = options.get(name.lower())
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {name}={text!r} is not an integer") from None
    if positive and value <= 0:
        raise ValueError(f"option {name} must be positive, got {value}")
    return value


def partition_json(name: str, text: str) -> Offsets:
    """`{"topic":{"0":23}}` as a dict, or a ValueError naming the option."""
    try:
        data: Any = json.loads(text)
        return {
            str(t): {str(int(p)): int(o) for p, o in parts.items()} for t, parts in data.items()
        }
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f'option {name}: expected {{"topic":{{"0":23}}}}, got {text!r}') from None


def _assign_json(text: str) -> dict[str, list[int]]:
    try:
        data: Any = json.loads(text)
        return {str(t): sorted({int(p) for p in parts}) for t, parts in data.items()}
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f'option assign: expected {{"topic":[0,1]}}, got {text!r}') from None


@dataclass(frozen=True)
class Bound:
    """Where a read starts or ends: `earliest`/`latest`/JSON offsets, or timestamps."""

    offsets: str  # "earliest", "latest" or JSON
    timestamp: int | None = None  # every partition
    by_timestamp: Offsets | None = None  # per partition

    def parsed_offsets(self, name: str) -> Offsets | None:
        """The JSON offsets, None for `earliest` / `latest`."""
        if self.offsets in ("earliest", "latest"):
            return None
        return partition_json(name, self.offsets)

    def timestamp_of(self, topic: str, partition: int) -> int | None:
        if self.timestamp is not None:
            return self.timestamp
        if self.by_timestamp is not None:
            return self.by_timestamp.get(topic, {}).get(str(partition))
        return None

    @property
    def by_time(self) -> bool:
        return self.timestamp is not None or self.by_timestamp is not None


@dataclass(frozen=True)
class ReadOptions:
    storage: str
    subscribe: list[str] = field(default_factory=list)
    pattern: str | None = None
    assign: dict[str, list[int]] | None = None
    store_options: dict[str, str] = field(default_factory=dict)
    cluster: str | None = None
    entropy_bits: int = 0
    partitions: set[int] | None = None
    starting: Bound = Bound("earliest")
    ending: Bound = Bound("latest")
    latest_when_no_match: bool = False  # startingOffsetsByTimestampStrategy=latest
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    max_records_per_partition: int | None = None
    min_partitions: int | None = None
    max_offsets_per_trigger: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    kafka: dict[str, str] = field(default_factory=dict)  # librdkafka settings, no prefix
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    segments: set[str] | None = None

    @classmethod
    def parse(cls, raw: dict[str, str], streaming: bool = False) -> ReadOptions:
        """Check and convert the options of a read (keys case-insensitive)."""
        options = {k.lower(): v for k, v in raw.items()}
        unknown = sorted(
            k for k in raw if k.lower() not in _KNOWN_LOWER and not k.lower().startswith(_PREFIXES)
        )
        if unknown:
            raise ValueError(
                f"unknown option(s) {', '.join(unknown)} of the tierbroker source; "
                f"it knows {', '.join(KNOWN)}"
            )
        storage = options.get("storage")
        if not storage:
            raise ValueError("the tierbroker source needs the `storage` option (file:// or s3://)")
        if "topic" in options and "subscribe" in options:
            raise ValueError("options topic and subscribe are synonyms: give one")
        chosen = [
            s for s in STRATEGIES if s in options or (s == "subscribe" and "topic" in options)
        ]
        if len(chosen) != 1:
            which = "One" if not chosen else "Only one"
            raise ValueError(
                f"{which} of the options subscribe (or topic), subscribePattern and assign "
                "must be given"
            )
        subscribe = options.get("subscribe") or options.get("topic") or ""
        topics = [t.strip() for t in subscribe.split(",") if t.strip()]
        if chosen == ["subscribe"] and not topics:
            raise ValueError(f"no topics to subscribe to: subscribe={subscribe!r}")
        pattern = options.get("subscribepattern")
        if pattern is not None:
            if not pattern.strip():
                raise ValueError("option subscribePattern is empty")
            try:
                re.compile(pattern.strip())
            except re.error as e:
                raise ValueError(f"option subscribePattern={pattern!r}: {e}") from None
        assign = _assign_json(options["assign"]) if "assign" in options else None

        starting = _bound(options, "starting", "earliest")
        ending = _bound(options, "ending", "latest")
        if streaming:
            for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
                if name.lower() in options:
                    raise ValueError(f"option {name} is not valid in streaming queries")
            starting = _bound(options, "starting", "latest")
        else:
            _check_batch_bounds(starting, ending)
        strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise ValueError(
                f"option startingOffsetsByTimestampStrategy={strategy!r}: error or latest"
            )

        partitions = options.get("partitions")
        if partitions and assign is not None:
            raise ValueError("option partitions narrows subscribe or subscribePattern, not assign")
        segments = options.get("segments")
        return cls(
            storage=storage,
            subscribe=topics,
            pattern=None if pattern is None else pattern.strip(),
            assign=assign,
            store_options={
                k: v
                for k, v in options.items()
                if k.startswith(("storage.", "encryption.")) or k == "key.prefix"
            },
            cluster=options.get("cluster") or None,
            entropy_bits=_number(options, "key.prefix.entropy.bits")
            or _number(options, "entropyBits")
            or 0,
            partitions=None if not partitions else {int(p) for p in partitions.split(",")},
            starting=starting,
            ending=ending,
            latest_when_no_match=strategy == "latest",
            max_bytes_per_partition=_number(options, "maxBytesPerPartition", positive=True)
            or DEFAULT_MAX_BYTES_PER_PARTITION,
            max_records_per_partition=_number(options, "maxRecordsPerPartition", positive=True),
            min_partitions=_number(options, "minPartitions", positive=True),
            max_offsets_per_trigger=_number(options, "maxOffsetsPerTrigger", positive=True),
            include_headers=_flag(options, "includeHeaders", False),
            fail_on_data_loss=_flag(options, "failOnDataLoss", True),
            kafka=_kafka_options(options),
            poll_timeout_ms=_number(options, "kafkaConsumer.pollTimeoutMs", positive=True)
            or DEFAULT_POLL_TIMEOUT_MS,
            segments=None if not segments else {s.strip() for s in segments.split(",")},
        )

    @property
    def through_broker(self) -> bool:
        """Whether offsets outside the remote tier are read through the brokers."""
        return "bootstrap.servers" in self.kafka

    @property
    def read_committed(self) -> bool:
        """`kafka.isolation.level=read_committed`: no record of an aborted transaction, and
        no offset past what is decided (the remote tier's proof, the brokers' LSO)."""
        return self.kafka.get("isolation.level") == "read_committed"

    def open(self) -> ObjectStore:
        return open_store(self.storage, self.store_options)


def _bound(options: dict[str, str], side: str, default: str) -> Bound:
    offsets = options.get(f"{side}offsets", default).strip()
    if offsets not in ("earliest", "latest"):
        partition_json(f"{side}Offsets", offsets)  # fail early on bad JSON
    by_text = options.get(f"{side}offsetsbytimestamp")
    timestamp = _number(options, f"{side}Timestamp")
    by = None if by_text is None else partition_json(f"{side}OffsetsByTimestamp", by_text)
    return Bound(offsets, timestamp, by)


def _check_batch_bounds(starting: Bound, ending: Bound) -> None:
    """Spark's batch rules: no start at latest, no end at earliest."""
    if not starting.by_time:
        if starting.offsets == "latest":
            raise ValueError("startingOffsets can't be latest for batch queries")
        for topic, parts in (starting.parsed_offsets("startingOffsets") or {}).items():
            for partition, offset in parts.items():
                if offset == LATEST:
                    raise ValueError(
                        f"startingOffsets for {topic}-{partition} can't be latest (-1) "
                        "for batch queries"
                    )
    if not ending.by_time:
        if ending.offsets == "earliest":
            raise ValueError("endingOffsets can't be earliest for batch queries")
        for topic, parts in (ending.parsed_offsets("endingOffsets") or {}).items():
            for partition, offset in parts.items():
                if offset == EARLIEST:
                    raise ValueError(
                        f"endingOffsets for {topic}-{partition} can't be earliest (-2) "
                        "for batch queries"
                    )


def _kafka_options(options: dict[str, str]) -> dict[str, str]:
    """The Kafka client's settings from the `kafka.*` options, refusing those Spark refuses."""
    kafka = {k.removeprefix("kafka."): v for k, v in options.items() if k.startswith("kafka.")}
    for name, why in _REFUSED_KAFKA.items():
        if name in kafka:
            raise ValueError(f"Kafka option '{name}' is not supported: {why}")
    isolation = kafka.get("isolation.level", "read_uncommitted").strip().lower()
    if isolation not in ("read_uncommitted", "read_committed"):
        raise ValueError(
            f"kafka.isolation.level={isolation}: read_uncommitted (the default) or read_committed"
        )
    if "isolation.level" in kafka:
        kafka["isolation.level"] = isolation
    # The isolation level says what is read, from the object store too: it needs no broker.
    if set(kafka) - {"isolation.level"} and "bootstrap.servers" not in kafka:
        raise ValueError(
            "kafka.* options configure the reads through the brokers: "
            "they need kafka.bootstrap.servers"
        )
    if kafka and "group.id" not in kafka:
        prefix = options.get("groupidprefix", "spark-kafka-relation")
        kafka["group.id"] = f"{prefix}-{uuid.uuid4()}"
    return kafka
