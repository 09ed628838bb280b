"""`tierbroker user scram set|describe|delete`: SCRAM users, as `kafka-configs.sh
--entity-type users --alter --add-config 'SCRAM-SHA-512=[password=...]'` manages them.

Through a broker (AlterUserScramCredentials / DescribeUserScramCredentials; a secured
listener is reached with `tierbroker --command-config client.properties user scram ...`),
or, before any broker runs, straight into ZooKeeper (`--zookeeper host:port/chroot`, as
`kafka-configs.sh --zookeeper` did): how the brokers' own inter-broker user is made.
The password comes from `--password`, `TIERBROKER_SCRAM_PASSWORD` or a prompt.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tierbroker.broker.cli.common import (
    Bootstrap,
    Output,
    OutputOption,
    Timeout,
    command_group,
    fail,
    failing,
    print_json,
    print_table,
    wait_each,
)
from tierbroker.broker.security.sasl.scram import MIN_ITERATIONS, ScramMechanism

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

app = command_group("Users of the cluster.")
scram = command_group("SCRAM credentials (SCRAM-SHA-256, SCRAM-SHA-512).")
app.add_typer(scram, name="scram")

MechanismOption = Annotated[
    str, typer.Option("--mechanism", "-m", help="SCRAM-SHA-256 or SCRAM-SHA-512")
]
ZooKeeper = Annotated[
    str | None,
    typer.Option(
        "--zookeeper",
        help="host:port[/chroot]: write ZooKeeper directly (before the brokers start)",
    ),
]


def _mechanism(name: str) -> ScramMechanism:
    mechanism = ScramMechanism.by_name(name.upper())
    if mechanism is None:
        raise typer.BadParameter(f"{name!r}: give SCRAM-SHA-256 or SCRAM-SHA-512")
    return mechanism


def _admin(bootstrap: str, timeout: float) -> AdminClient:
    from confluent_kafka.admin import AdminClient

    from tierbroker.broker.cli.common import client_config

    return AdminClient(client_config(bootstrap, timeout))


@scram.command("set")
def set_credential(
    user: Annotated[str, typer.Argument(help="the user name")],
    password: Annotated[
        str,
        typer.Option(
            envvar="TIERBROKER_SCRAM_PASSWORD", prompt=True, hide_input=True, help="the password"
        ),
    ],
    mechanism: MechanismOption = "SCRAM-SHA-512",
    iterations: Annotated[int, typer.Option(help="4096 to 16384")] = MIN_ITERATIONS,
    bootstrap: Bootstrap = "127.0.0.1:9092",
    zookeeper: ZooKeeper = None,
    timeout: Timeout = 30.0,
) -> None:
    """Create or replace USER's credential of one mechanism."""
    scram_mechanism = _mechanism(mechanism)
    if zookeeper is not None:
        credential = scram_mechanism.new_credential(password, iterations)
        _in_zookeeper(zookeeper, user, {scram_mechanism: credential}, timeout)
    else:
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            UserScramCredentialUpsertion,
        )
        from confluent_kafka.admin import ScramMechanism as ClientMechanism

        info = ScramCredentialInfo(ClientMechanism[scram_mechanism.name], iterations)
        with failing(f"set the {mechanism} credential of {user}", bootstrap):
            admin = _admin(bootstrap, timeout)
            futures = admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion(user, info, password.encode())],
                request_timeout=timeout,
            )
        wait_each(f"set the {mechanism} credential of", futures, bootstrap, timeout)
    typer.echo(f"set the {scram_mechanism.mechanism_name} credential of {user}", err=True)


@scram.command("delete")
def delete_credential(
    user: Annotated[str, typer.Argument(help="the user name")],
    mechanism: MechanismOption = "SCRAM-SHA-512",
    bootstrap: Bootstrap = "127.0.0.1:9092",
    zookeeper: ZooKeeper = None,
    timeout: Timeout = 30.0,
) -> None:
    """Delete USER's credential of one mechanism."""
    scram_mechanism = _mechanism(mechanism)
    if zookeeper is not None:
        _in_zookeeper(zookeeper, user, {scram_mechanism: None}, timeout)
    else:
        from confluent_kafka.admin import ScramMechanism as ClientMechanism
        from confluent_kafka.admin import UserScramCredentialDeletion

        with failing(f"delete the {mechanism} credential of {user}", bootstrap):
            admin = _admin(bootstrap, timeout)
            futures = admin.alter_user_scram_credentials(
                [UserScramCredentialDeletion(user, ClientMechanism[scram_mechanism.name])],
                request_timeout=timeout,
            )
        wait_each(f"delete the {mechanism} credential of", futures, bootstrap, timeout)
    typer.echo(f"deleted the {scram_mechanism.mechanism_name} credential of {user}", err=True)


@scram.command("describe")
def describe(
    users: Annotated[list[str] | None, typer.Argument(help="users (all when none)")] = None,
    bootstrap: Bootstrap = "127.0.0.1:9092",
    timeout: Timeout = 30.0,
    output: OutputOption = Output.table,
) -> None:
    """The mechanisms and iterations of users' credentials (never a secret)."""
    rows: list[dict[str, Any]] = []
    with failing("describe SCRAM users", bootstrap):
        admin = _admin(bootstrap, timeout)
        # One future for every user, or one per user named.
        result = admin.describe_user_scram_credentials(users or None, request_timeout=timeout)
        if isinstance(result, dict):
            descriptions = {user: future.result(timeout) for user, future in result.items()}
        else:
            descriptions = result.result(timeout)
    for user, description in sorted(descriptions.items()):
        for info in description.scram_credential_infos:
            rows.append(
                {
                    "user": user,
                    "mechanism": info.mechanism.name.replace("_", "-"),
                    "iterations": info.iterations,
                }
            )
    if output is Output.json:
        print_json(rows)
        return
    print_table(
        ("user", "mechanism", "iterations"),
        [(r["user"], r["mechanism"], r["iterations"]) for r in rows],
        empty="no SCRAM users",
    )


def _in_zookeeper(
    connect: str,
    user: str,
    changes: dict[ScramMechanism, Any],
    timeout_s: float,
) -> None:
    from tierbroker.broker.metadata import zk_data as zk
    from tierbroker.broker.metadata.scram_credentials import alter_credentials
    from tierbroker.broker.metadata.store import NodeExistsError, StoreError
    from tierbroker.broker.metadata.zk_store import ZooKeeperStore

    async def write() -> None:
        store = ZooKeeperStore(connect)
        async with asyncio.timeout(timeout_s):
            await store.start()
            try:
                for path in (zk.USER_CONFIGS, zk.CONFIG_CHANGES):  # before any broker made them
                    try:
                        await store.create(path, make_parents=True)
                    except NodeExistsError:
                        pass
                await alter_credentials(store, user, changes)
            finally:
                await store.close()

    try:
        asyncio.run(write())
    except TimeoutError:
        fail(f"ZooKeeper {connect}: no answer within {timeout_s:g} s")
    except StoreError as e:
        fail(f"ZooKeeper {connect}: {e}")
