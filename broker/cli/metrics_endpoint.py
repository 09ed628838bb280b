"""A broker's metrics endpoint (`metrics.port`), as `tier status` and `topic describe` find
and read it: the broker is asked for its own `metrics.port` (DescribeConfigs answers the
port bound, so `metrics.port=0` works) and the endpoint is that port on the host the
client reaches the broker at."""

from __future__ import annotations

import json
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient


def metrics_url(admin: AdminClient, broker_id: int, host: str, timeout_s: float) -> str | None:
    """`http://host:port` of broker `broker_id`'s metrics endpoint; None if it has none.
    Raises the client's errors (inside `failing`)."""
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.BROKER, str(broker_id))
    [future] = admin.describe_configs([resource], request_timeout=timeout_s).values()
    entry = future.result(timeout_s).get("metrics.port")
    metrics_port = int(entry.value) if entry is not None and entry.value else -1
    return f"http://{host or '127.0.0.1'}:{metrics_port}" if metrics_port >= 0 else None


def get_json(url: str, timeout_s: float) -> Any:
    """The JSON document at `url`; raises OSError or ValueError."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.load(response)
