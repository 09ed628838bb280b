"""Object-store price tables, and what a topic's counted usage costs at them.

Three defaults, from the providers' public price pages (USD, 1 GB = 2^30 bytes as they
bill it):

- `s3-standard`: S3 Standard in us-east-1 (https://aws.amazon.com/s3/pricing/): storage
  $0.023/GB-month (first 50 TB); PUT, COPY, POST and LIST $0.005 per 1,000; GET and all
  other requests $0.0004 per 1,000; DELETE and CANCEL free.
- `s3-express-one-zone`: S3 Express One Zone in us-east-1 (same page, and its example
  in https://aws.amazon.com/s3/faqs/): storage $0.11/GB-month;
  PUT $0.00113 and GET $0.00003 per 1,000; data upload $0.0032/GB and retrieval
  $0.0006/GB. Those two apply to the part of a request over 512 KB: here to all of its
  bytes, an upper bound.
- `gcs-standard`: Cloud Storage Standard in us-central1
  (https://cloud.google.com/storage/pricing): storage $0.020/GB-month; Class A
  operations (inserts, listings) $0.005 and Class B (gets) $0.0004 per 1,000; deletes
  free.

Cross-zone transfer, paid for the bytes a broker serves to a reader in another rack:
AWS charges $0.01/GB on each side of an Availability Zone crossing, $0.02/GB in all
(https://aws.amazon.com/ec2/pricing/on-demand/, "Data Transfer within the same AWS
Region"); Google Cloud $0.01/GB between zones of a region
(https://cloud.google.com/vpc/network-pricing). Transfer between a broker and the
object store in its region is free on both.

A user file (JSON) overrides or adds tables: `{"<name>": {"<field>": number, ...}}`.
A table named like a default changes only the fields given; a new name gives them all.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GB = 1 << 30
DEFAULT_TABLE = "s3-standard"


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceTable:
    """USD prices of one object store and its network."""

    put_per_1000: float
    get_per_1000: float
    list_per_1000: float
    delete_per_1000: float
    storage_per_gb_month: float
    cross_zone_per_gb: float
    upload_per_gb: float = 0.0
    download_per_gb: float = 0.0


DEFAULTS: dict[str, PriceTable] = {
    "s3-standard": PriceTable(
        put_per_1000=0.005,
        get_per_1000=0.0004,
        list_per_1000=0.005,
        delete_per_1000=0.0,
        storage_per_gb_month=0.023,
        cross_zone_per_gb=0.02,
    ),
    "s3-express-one-zone": PriceTable(
        put_per_1000=0.00113,
        get_per_1000=0.00003,
        list_per_1000=0.00113,
        delete_per_1000=0.0,
        storage_per_gb_month=0.11,
        cross_zone_per_gb=0.02,
        upload_per_gb=0.0032,
        download_per_gb=0.0006,
    ),
    "gcs-standard": PriceTable(
        put_per_1000=0.005,
        get_per_1000=0.0004,
        list_per_1000=0.005,
        delete_per_1000=0.0,
        storage_per_gb_month=0.020,
        cross_zone_per_gb=0.01,
    ),
}
FIELDS = tuple(f.name for f in dataclasses.fields(PriceTable))


class PriceTableError(ValueError):
    """A price file or table name that cannot be used; the message says what to fix."""


def price_tables(path: Path | None = None) -> dict[str, PriceTable]:
    """The default tables, with those of the JSON file at `path` over them."""
    tables = dict(DEFAULTS)
    if path is None:
        return tables
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PriceTableError(f"cannot read price file {path}: {e}") from None
    if not isinstance(document, dict):
        raise PriceTableError(f"{path}: expected an object of tables by name")
    for name, fields in document.items():
        tables[name] = _table(path, name, fields, DEFAULTS.get(name))
    return tables


def _table(path: Path, name: str, fields: Any, base: PriceTable | None) -> PriceTable:
    if not isinstance(fields, dict):
        raise PriceTableError(f"{path}: table {name!r} is not an object of prices")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise PriceTableError(
            f"{path}: table {name!r}: unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})"
        )
    for field, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise PriceTableError(
                f"{path}: table {name!r}: {field} must be a number >= 0, got {value!r}"
            )
    if base is not None:
        return dataclasses.replace(base, **fields)
    required = [f.name for f in dataclasses.fields(PriceTable) if f.default is dataclasses.MISSING]
    missing = [f for f in required if f not in fields]
    if missing:
        raise PriceTableError(f"{path}: new table {name!r} lacks {', '.join(missing)}")
    return PriceTable(**fields)


def select(tables: Mapping[str, PriceTable], name: str) -> PriceTable:
    try:
        return tables[name]
    except KeyError:
        raise PriceTableError(
            f"no price table {name!r}: use one of {', '.join(sorted(tables))}"
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """USD: requests and transfer for the usage counted; storage per month at its size."""

    requests: float
    transfer: float
    storage_per_month: float

    @property
    def total(self) -> float:
        """Requests and transfer, with a month of storage."""
        return self.requests + self.transfer + self.storage_per_month


def topic_cost(table: PriceTable, usage: Mapping[str, Any]) -> Cost:
    """What one topic's entry of `/tier/usage` (see `tier_usage`) costs at `table`."""
    store_bytes = usage["object_store_bytes"]
    cross_rack = sum(tier["cross-rack"] for tier in usage["bytes_out"].values())
    return Cost(
        requests=requests_cost(table, usage["requests"]),
        transfer=cross_rack * table.cross_zone_per_gb / GB
        + store_transfer_cost(table, store_bytes["upload"], store_bytes["download"]),
        storage_per_month=usage["remote_bytes"] * table.storage_per_gb_month / GB,
    )


def requests_cost(table: PriceTable, requests: Mapping[str, int]) -> float:
    """USD for requests by kind (`put`, `get`, `list`, `delete`; a kind left out: none)."""
    return (
        requests.get("put", 0) * table.put_per_1000
        + requests.get("get", 0) * table.get_per_1000
        + requests.get("list", 0) * table.list_per_1000
        + requests.get("delete", 0) * table.delete_per_1000
    ) / 1000


def store_transfer_cost(table: PriceTable, upload_bytes: int, download_bytes: int) -> float:
    """USD for bytes sent to and received from the store (S3 Express bills them)."""
    return (upload_bytes * table.upload_per_gb + download_bytes * table.download_per_gb) / GB
