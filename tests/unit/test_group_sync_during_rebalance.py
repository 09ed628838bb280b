"""SyncGroup while another rebalance begins: the leader's assignment is being stored when
a new member joins, so the group is preparing a rebalance by the time the store answers.
As in Kafka, the leader then gets REBALANCE_IN_PROGRESS and the group stays preparing;
the stored assignment must not make it stable."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.unit.test_group_coordinator_stop import Store
from tierbroker.broker.coordinator.group.coordinator import (
    GroupConfig,
    GroupCoordinator,
    JoinRequest,
)
from tierbroker.broker.coordinator.group.group import GroupState
from tierbroker.protocol.errors import ErrorCode


class SlowStore(Store):
    """Stores a group only when `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.storing = asyncio.Event()
        self.release = asyncio.Event()

    async def store_group(self, group_id: str, value: Any) -> None:
        self.storing.set()
        await self.release.wait()


def join(member_id: str = "") -> JoinRequest:
    return JoinRequest(
        group_id="g",
        member_id=member_id,
        group_instance_id=None,
        client_id="c",
        client_host="h",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=[("range", b"")],
        require_known_member_id=False,
        supports_skip_assignment=False,
    )


def test_a_join_while_the_assignment_is_stored_answers_the_leader_rebalance_in_progress() -> None:
    async def run() -> tuple[ErrorCode, GroupState]:
        store = SlowStore()
        config = GroupConfig(initial_rebalance_delay_ms=0)
        groups = GroupCoordinator(config, store, lambda tp: True)  # type: ignore[arg-type]
        prepare = groups._prepare_rebalance
        rebalancing = asyncio.Event()

        def recording(group: Any, reason: str) -> None:
            prepare(group, reason)
            rebalancing.set()

        groups._prepare_rebalance = recording  # type: ignore[method-assign]
        groups.start()
        groups.on_leadership(0, True)
        await asyncio.gather(*(t for t in asyncio.all_tasks() if t.get_name() == "load-groups-0"))
        leader = await groups.join_group(join())
        assert leader.error == ErrorCode.none
        sync = asyncio.create_task(
            groups.sync_group("g", leader.generation_id, leader.member_id, None, None, None, {})
        )
        await store.storing.wait()
        rebalancing.clear()
        newcomer = asyncio.create_task(groups.join_group(join()))
        await rebalancing.wait()
        store.release.set()
        result = await sync
        state = groups.groups["g"].state
        newcomer.cancel()
        await groups.stop()
        return result.error, state

    assert asyncio.run(run()) == (ErrorCode.rebalance_in_progress, GroupState.PREPARING_REBALANCE)
