"""The pinned request versions: within kio's schemas, one range per handler."""

from __future__ import annotations

from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from tierbroker.broker.handlers import HANDLERS, sasl
from tierbroker.protocol.versions import SUPPORTED_VERSIONS


def test_every_pinned_version_has_a_kio_schema() -> None:
    missing = [
        (key, version)
        for key, (low, high) in SUPPORTED_VERSIONS.items()
        for version in range(low, high + 1)
        if EntityType.request not in schema_name_map[api_key_map[key]].get(version, ())
    ]
    assert missing == []


def test_every_handler_has_a_pinned_range_and_no_range_lacks_a_handler() -> None:
    """SaslHandshake and SaslAuthenticate are the connection's authenticator's (`sasl`)."""
    assert set(SUPPORTED_VERSIONS) == set(HANDLERS) | set(sasl.API_KEYS)
