"""`tier_usage`: what each topic cost this broker, as `GET /tier/usage` answers it and
`tierbroker tier status --cost` prices it.

    {"topics": {"<topic>": {
        "requests": {"put": n, "get": n, "list": n, "delete": n},
        "object_store_bytes": {"upload": n, "download": n},
        "bytes_out": {"local": {"same-rack": n, "cross-rack": n}, "remote": {...}},
        "remote_bytes": n}}}

Counts since this broker started, of this broker alone: the requests its plugin made
(`ObjectStoreMeter`), the bytes its fetch responses carried (`ServedBytesMeter`), and
the remote tier's size of the partitions it leads now. Every key is present, zeros
included, so a reader needs no defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tierbroker.broker.metrics.served_bytes import Direction, Tier
from tierbroker.storage.remote.request_meter import ObjectStoreUsage, RequestKind, Transfer


def tier_usage(
    object_store: Mapping[str, ObjectStoreUsage],
    served: Mapping[str, Mapping[tuple[Tier, Direction], int]],
    remote_bytes: Mapping[str, int],
) -> dict[str, Any]:
    """The JSON document of the counts (see the module's docstring)."""
    topics = object_store.keys() | served.keys() | remote_bytes.keys()
    empty = ObjectStoreUsage()
    return {
        "topics": {
            topic: {
                "requests": {
                    k.value: object_store.get(topic, empty).requests.get(k, 0) for k in RequestKind
                },
                "object_store_bytes": {
                    d.value: object_store.get(topic, empty).bytes.get(d, 0) for d in Transfer
                },
                "bytes_out": {
                    tier.value: {
                        to.value: served.get(topic, {}).get((tier, to), 0) for to in Direction
                    }
                    for tier in Tier
                },
                "remote_bytes": remote_bytes.get(topic, 0),
            }
            for topic in sorted(topics)
        }
    }
