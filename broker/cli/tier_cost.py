"""`tierbroker tier status --cost`: per topic, what the broker asked of its object store,
what its fetches served by tier and rack, and what that cost at a price table
(`prices`), from the broker's `GET /tier/usage`."""

from __future__ import annotations

from typing import Any

from tierbroker.broker.cli.common import print_json, print_table, size_text
from tierbroker.broker.cli.prices import PriceTable, topic_cost


def show_cost(usage: dict[str, Any], table_name: str, table: PriceTable, as_json: bool) -> None:
    """Print `usage` (a `/tier/usage` document) and its cost at `table`."""
    topics = usage["topics"]
    costs = {topic: topic_cost(table, counts) for topic, counts in topics.items()}
    if as_json:
        print_json(
            {
                "price_table": table_name,
                "topics": [
                    {
                        "topic": topic,
                        **counts,
                        "cost_usd": {
                            "requests": costs[topic].requests,
                            "transfer": costs[topic].transfer,
                            "storage_per_month": costs[topic].storage_per_month,
                            "total": costs[topic].total,
                        },
                    }
                    for topic, counts in topics.items()
                ],
            }
        )
        return
    empty = "no topic has used the remote tier or been fetched from this broker"
    print_table(
        ("topic", "put", "get", "list", "delete", "uploaded", "downloaded"),
        [
            (
                topic,
                *(counts["requests"][kind] for kind in ("put", "get", "list", "delete")),
                size_text(counts["object_store_bytes"]["upload"]),
                size_text(counts["object_store_bytes"]["download"]),
            )
            for topic, counts in topics.items()
        ],
        title="object-store requests and bytes (since the broker started)",
        empty=empty,
    )
    if not topics:
        return
    print_table(
        ("topic", "local same", "local cross", "remote same", "remote cross"),
        [
            (
                topic,
                *(
                    size_text(counts["bytes_out"][tier][to])
                    for tier in ("local", "remote")
                    for to in ("same-rack", "cross-rack")
                ),
            )
            for topic, counts in topics.items()
        ],
        title="bytes fetched by consumers and followers, by tier and rack",
    )
    print_table(
        ("topic", "requests", "transfer", "storage/month", "total"),
        [
            (
                topic,
                _usd(cost.requests),
                _usd(cost.transfer),
                _usd(cost.storage_per_month),
                _usd(cost.total),
            )
            for topic, cost in costs.items()
        ],
        title=f"cost in USD at {table_name} prices (storage: a month at today's remote size)",
    )


def _usd(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.6f}"
