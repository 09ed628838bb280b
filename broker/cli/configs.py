"""Configs as kafka-configs.sh shows and changes them: the options and the table the topic
and broker config commands share, and a topic's configs through librdkafka
(IncrementalAlterConfigs sets or deletes the keys named and leaves the others)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tierbroker.broker.cli.common import admin_client, failing, key_values, print_table

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

SetOption = Annotated[
    list[str] | None, typer.Option("--config", "--set", help="key=value to set, repeatable")
]
DeleteOption = Annotated[
    list[str] | None,
    typer.Option("--delete-config", help="key to return to its default, repeatable"),
]


def described(admin: AdminClient, topic: str, timeout: float) -> list[dict[str, Any]]:
    """Every config of `topic`: name, value, source, default, sorted by name. Raises the
    client's errors (inside `failing`)."""
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    [future] = admin.describe_configs([resource], request_timeout=timeout).values()
    return [
        {
            "name": e.name,
            "value": e.value,
            "source": _source_name(e.source),
            "default": e.is_default,
        }
        for e in sorted(future.result(timeout).values(), key=lambda e: e.name)
    ]


def print_configs(configs: list[dict[str, Any]], title: str, empty: str) -> None:
    """Configs as `described` gives them, one row each: name, value, source."""
    print_table(
        ("config", "value", "source"),
        [(c["name"], c["value"], c["source"].lower()) for c in configs],
        title=title,
        empty=empty,
    )


def alter(
    topic: str,
    config: list[str] | None,
    delete_config: list[str] | None,
    bootstrap: str,
    timeout: float,
) -> None:
    """Set `config` (key=value) and delete `delete_config` keys of `topic`, in one
    IncrementalAlterConfigs request."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    changes = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in key_values(config, "--config").items()
    ] + [
        ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE)
        for k in delete_config or ()
    ]
    if not changes:
        raise typer.BadParameter("give --config key=value or --delete-config key")
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=changes)
    with failing(f"alter configs of topic {topic}", bootstrap):
        admin = admin_client(bootstrap, timeout)
        futures = admin.incremental_alter_configs([resource], request_timeout=timeout)
        for future in futures.values():
            future.result(timeout)
    typer.echo(f"altered configs of topic {topic}", err=True)


def _source_name(source: Any) -> str:
    """A ConfigSource as its name (the client gives the enum, or its number)."""
    from confluent_kafka.admin import ConfigSource

    return str(source.name if isinstance(source, ConfigSource) else ConfigSource(source).name)
