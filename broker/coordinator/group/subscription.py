"""The consumer protocol's subscription metadata: which topics a member wants.

The bytes a consumer puts in JoinGroup are an int16 version followed by kio's
ConsumerProtocolSubscription of that version; newer versions than kio knows are
read as the newest it knows, as Kafka reads forward-compatible versions.
"""

from __future__ import annotations

import struct

from kio.index import load_entity_schema
from kio.serial import entity_reader
from kio.static.constants import EntityType

_MAX_KNOWN_VERSION = 3


def subscribed_topics(metadata: bytes) -> set[str]:
    """Topic names in a consumer's subscription; ValueError if it cannot be read."""
    if len(metadata) < 2:
        raise ValueError("subscription metadata shorter than its version")
    (version,) = struct.unpack_from(">h", metadata)
    schema = load_entity_schema(
        "consumer_protocol_subscription", min(max(version, 0), _MAX_KNOWN_VERSION), EntityType.data
    )
    try:
        subscription, _ = entity_reader(schema)(metadata, 2)
    except Exception as e:  # kio raises assorted errors on malformed input
        raise ValueError(f"unreadable subscription: {e}") from e
    topics: tuple[str, ...] = getattr(subscription, "topics")  # noqa: B009 (kio Entity)
    return set(topics)
